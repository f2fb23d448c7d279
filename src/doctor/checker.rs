//! One check's bookkeeping: the comparisons it makes (each a case), the kernels it ran, and
//! the deliberate error a test can inject into its references.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::gpu::GpuContext;

use super::compare::{self, Comparison};

/// One comparison of a check: a kernel's output on one input against its reference.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CaseRecord {
    pub what: String,
    pub passed: bool,
    /// Largest |got - want| (None: NaN or infinite).
    pub max_abs_err: Option<f64>,
    /// The largest error as a share of its tolerance (1: at the limit; None: NaN or infinite).
    pub tolerance_used: Option<f64>,
    /// The comparison in words: the margin left, or the first value outside the tolerance.
    pub detail: String,
}

fn finite(v: f32) -> Option<f64> {
    v.is_finite().then_some(v as f64)
}

/// Collects one check's comparisons on one device.
pub struct Checker<'a> {
    pub ctx: &'a GpuContext,
    /// Make every reference of this check wrong (a test that the doctor can fail).
    perturb: bool,
    /// Kernel variants the check ran.
    pub kernels: u32,
    pub cases: Vec<CaseRecord>,
}

impl<'a> Checker<'a> {
    pub fn new(ctx: &'a GpuContext, perturb: bool) -> Checker<'a> {
        Checker { ctx, perturb, kernels: 0, cases: Vec::new() }
    }

    /// Counts `n` more kernel variants run.
    pub fn ran(&mut self, n: u32) {
        self.kernels += n;
    }

    /// The reference as given, or deliberately wrong in one value (far outside any tolerance).
    fn reference<'w>(&self, want: &'w [f32]) -> Cow<'w, [f32]> {
        if !self.perturb || want.is_empty() {
            return Cow::Borrowed(want);
        }
        let mut w = want.to_vec();
        let i = w.len() / 2;
        w[i] += 1000.0 * compare::scale(want);
        Cow::Owned(w)
    }

    /// |got - want| <= tol x max(1, max |want|).
    pub fn close(&mut self, what: impl Into<String>, got: &[f32], want: &[f32], tol: f32) {
        let c = compare::close(got, &self.reference(want), tol);
        self.record(what.into(), c);
    }

    /// |got - want| <= bound + tol x max(1, max |want|).
    pub fn within(&mut self, what: impl Into<String>, got: &[f32], want: &[f32], bound: &[f32], tol: f32) {
        let c = compare::within(got, &self.reference(want), bound, tol);
        self.record(what.into(), c);
    }

    /// The same bits.
    pub fn bits(&mut self, what: impl Into<String>, got: &[f32], want: &[f32]) {
        let c = compare::bits(got, &self.reference(want));
        self.record(what.into(), c);
    }

    /// The same token ids.
    pub fn tokens(&mut self, what: impl Into<String>, got: &[u32], want: &[u32]) {
        let mut want = Cow::Borrowed(want);
        if self.perturb && !want.is_empty() {
            want.to_mut()[0] ^= 1;
        }
        let c = compare::tokens(got, &want);
        self.record(what.into(), c);
    }

    /// A condition that is not a comparison of values (e.g. how many dispatches ran).
    pub fn expect(&mut self, what: impl Into<String>, ok: bool, detail: impl Into<String>) {
        let detail = detail.into();
        self.cases.push(CaseRecord { what: what.into(), passed: ok, max_abs_err: None, tolerance_used: None, detail });
    }

    fn record(&mut self, what: String, c: Comparison) {
        self.cases.push(CaseRecord {
            what,
            passed: c.passed(),
            max_abs_err: finite(c.max_abs),
            tolerance_used: finite(c.worst),
            detail: c.to_string(),
        });
    }
}
