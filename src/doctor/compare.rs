//! A kernel's output against its CPU reference: the largest error, how much of its tolerance
//! it used, and the first element outside it. The doctor and the test suite compare alike.

use std::fmt;

/// One element outside its tolerance (NaN counts as outside).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mismatch {
    pub index: usize,
    pub got: f32,
    pub want: f32,
    pub allowed: f32,
}

/// How a result compares with its reference.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Comparison {
    /// Values compared (the shorter length where they differ).
    pub len: usize,
    /// (got, want) lengths when they differ: a failure.
    pub len_mismatch: Option<(usize, usize)>,
    /// Largest |got - want| (NaN where a value was NaN).
    pub max_abs: f32,
    /// Largest |got - want| / allowed: 1 is at the tolerance, so the margin left is visible.
    pub worst: f32,
    pub worst_at: usize,
    /// Elements outside their tolerance, and the first of them.
    pub bad: usize,
    pub first_bad: Option<Mismatch>,
    /// The tolerance is zero: ids or bits must be equal.
    pub exact: bool,
}

impl Comparison {
    pub fn passed(&self) -> bool {
        self.bad == 0 && self.len_mismatch.is_none()
    }
}

/// a > b, or either is NaN.
fn above(a: f32, b: f32) -> bool {
    !matches!(a.partial_cmp(&b), Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal))
}

/// Compares element by element with a tolerance `allowed(i, want)`.
fn compare(got: &[f32], want: &[f32], allowed: impl Fn(usize) -> f32, differ: impl Fn(f32, f32) -> f32) -> Comparison {
    let mut c = Comparison { len: got.len().min(want.len()), ..Default::default() };
    if got.len() != want.len() {
        c.len_mismatch = Some((got.len(), want.len()));
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = differ(g, w);
        let a = allowed(i);
        let ratio = if d == 0.0 { 0.0 } else { d / a };
        // A NaN fails every comparison: it becomes the maximum and stays (and counts as bad).
        if !c.worst.is_nan() && above(ratio, c.worst) {
            c.worst = ratio;
            c.worst_at = i;
        }
        if !c.max_abs.is_nan() && above(d, c.max_abs) {
            c.max_abs = d;
        }
        if above(d, a) {
            c.bad += 1;
            if c.first_bad.is_none() {
                c.first_bad = Some(Mismatch { index: i, got: g, want: w, allowed: a });
            }
        }
    }
    c
}

/// The larger of 1 and max |want|: tolerances are relative to a result's size, absolute
/// below 1.
pub fn scale(want: &[f32]) -> f32 {
    want.iter().fold(1f32, |m, v| m.max(v.abs()))
}

/// |got - want| <= tol x max(1, max |want|), element by element.
pub fn close(got: &[f32], want: &[f32], tol: f32) -> Comparison {
    let allowed = tol * scale(want);
    compare(got, want, |_| allowed, |g, w| (g - w).abs())
}

/// |got - want| <= bound + tol x max(1, max |want|), element by element: for kernels that
/// round on purpose (int8 activations, f16 tiles), with the bound that rounding allows.
pub fn within(got: &[f32], want: &[f32], bound: &[f32], tol: f32) -> Comparison {
    let slack = tol * scale(want);
    let mut c = compare(got, want, |i| bound.get(i).copied().unwrap_or(0.0) + slack, |g, w| (g - w).abs());
    if bound.len() != want.len() && c.len_mismatch.is_none() {
        c.len_mismatch = Some((bound.len(), want.len()));
    }
    c
}

/// The same bits (a decoder must reproduce the reference exactly).
pub fn bits(got: &[f32], want: &[f32]) -> Comparison {
    let differ = |g: f32, w: f32| if g.to_bits() == w.to_bits() { 0.0 } else { (g - w).abs().max(f32::MIN_POSITIVE) };
    Comparison { exact: true, ..compare(got, want, |_| 0.0, differ) }
}

/// The same token ids.
pub fn tokens(got: &[u32], want: &[u32]) -> Comparison {
    let (g, w): (Vec<f32>, Vec<f32>) =
        (got.iter().map(|&t| t as f32).collect(), want.iter().map(|&t| t as f32).collect());
    let differ = |a: f32, b: f32| if a == b { 0.0 } else { 1.0 };
    Comparison { exact: true, ..compare(&g, &w, |_| 0.0, differ) }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((g, w)) = self.len_mismatch {
            return write!(f, "{g} values, {w} expected");
        }
        match (self.first_bad, self.exact) {
            (Some(m), true) => write!(
                f,
                "{} of {} differ, the first at index {}: got {}, want {}",
                self.bad, self.len, m.index, m.got, m.want
            ),
            (Some(m), false) => write!(
                f,
                "{} of {} outside the tolerance, the first at index {}: got {}, want {} (|Δ| {:.3e} > {:.3e})",
                self.bad,
                self.len,
                m.index,
                m.got,
                m.want,
                (m.got - m.want).abs(),
                m.allowed
            ),
            (None, true) => write!(f, "all {} equal", self.len),
            (None, false) => write!(
                f,
                "max |Δ| {:.3e}, {:.0}% of the tolerance (at index {})",
                self.max_abs,
                self.worst * 100.0,
                self.worst_at
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerance_is_relative_above_one() {
        assert!(close(&[1.0, 100.001], &[1.0, 100.0], 2e-5).passed());
        let c = close(&[1.0, 100.01], &[1.0, 100.0], 2e-5);
        assert!(!c.passed());
        assert_eq!(c.first_bad.map(|m| m.index), Some(1));
        assert!(c.to_string().contains("index 1"), "{c}");
        // Below 1 the tolerance is absolute.
        assert!(close(&[1e-6], &[0.0], 2e-5).passed());
    }

    #[test]
    fn nan_and_lengths_fail() {
        let c = close(&[f32::NAN, 0.0], &[0.0, 0.0], 1.0);
        assert!(!c.passed() && c.max_abs.is_nan() && c.bad == 1, "{c:?}");
        assert!(!close(&[0.0], &[0.0, 0.0], 1.0).passed());
        assert!(!within(&[0.0], &[0.0], &[], 1.0).passed());
    }

    #[test]
    fn bounds_tokens_and_bits() {
        assert!(within(&[1.5], &[1.0], &[0.5], 0.0).passed());
        assert!(!within(&[1.6], &[1.0], &[0.5], 0.0).passed());
        assert!(within(&[1.6], &[1.0], &[0.5], 0.1).passed());
        let t = tokens(&[3, 4, 5], &[3, 9, 5]);
        assert_eq!((t.bad, t.first_bad.map(|m| m.index)), (1, Some(1)));
        assert!(t.to_string().starts_with("1 of 3 differ"), "{t}");
        assert!(tokens(&[1, 2], &[1, 2]).passed());
        assert!(!bits(&[0.0], &[-0.0]).passed());
        assert!(bits(&[0.5], &[0.5]).passed());
    }
}
