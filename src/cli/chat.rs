//! `kiln chat`: an interactive conversation. The KV cache carries over between turns (only
//! the new part of the rendered conversation is prefilled); when the context fills up, the
//! oldest turns are dropped and the rest is prefilled again.

use std::io::{BufRead, Write};
use std::sync::atomic::Ordering;

use crate::chat::{new_part, render_tokens as render, ChatTemplate, Message};
use crate::cli::load::{load_model, open_session, ModelArgs};
use crate::cli::run::{interrupt_flag, SamplingArgs};
use crate::generate::{generate, sampler, StopReason};
use crate::Result;

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// System prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// Chat template: chatml, llama2, llama3 or zephyr (default: the model's own).
    #[arg(long = "chat-template")]
    pub chat_template: Option<String>,
    /// Most tokens per answer (-1: until the model ends its turn).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_hyphen_values = true)]
    pub n_predict: i64,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

pub fn run(args: &ChatArgs) -> Result<()> {
    let cfg = args.sampling.config()?;
    let (model, tok) = load_model(&args.model)?;
    let bos = tok.bos().and_then(|b| tok.token_str(b)).unwrap_or("").to_string();
    let eos = tok.eos().and_then(|b| tok.token_str(b)).unwrap_or("").to_string();
    let tmpl = ChatTemplate::select(&model.file, args.chat_template.as_deref(), bos, eos)?;
    let mut session = open_session(&model, &args.model, 64, false)?;
    let n_ctx = session.opts.n_ctx as usize;
    let stop = interrupt_flag();
    let mut sampler = sampler(cfg, args.sampling.seed);
    let max_new = if args.n_predict < 0 { None } else { Some(args.n_predict as usize) };
    let system: Vec<Message> = args.system.iter().map(|s| Message::new("system", s)).collect();
    let mut messages = system.clone();
    let mut cached: Vec<u32> = Vec::new();
    eprintln!("kiln chat: {} ({} template, context {n_ctx}). /reset clears the conversation, /exit quits, Ctrl-C stops an answer.", model.cfg.name, tmpl.source);
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        std::io::stderr().flush()?;
        let line = match lines.next() {
            Some(l) => l?,
            None => break,
        };
        let input = line.trim();
        match input {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = system.clone();
                cached.clear();
                session.reset();
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        messages.push(Message::new("user", input));
        let mut ids = render(&tmpl, &tok, &messages)?;
        // Drop the oldest turns (keeping the system prompt) until the prompt and some room
        // for the answer fit.
        let reserve = max_new.unwrap_or(256).min(n_ctx / 4);
        while ids.len() + reserve > n_ctx && messages.len() > system.len() + 1 {
            messages.remove(system.len());
            ids = render(&tmpl, &tok, &messages)?;
            eprintln!("(context full: dropped the oldest turn)");
        }
        if ids.len() >= n_ctx {
            eprintln!(
                "kiln: this message alone does not fit the context of {n_ctx} tokens; try a shorter one or raise -c"
            );
            messages.pop();
            continue;
        }
        let feed = new_part(&mut session, &mut cached, &ids);
        stop.store(false, Ordering::SeqCst);
        let mut answer = String::new();
        let mut out = std::io::stdout().lock();
        let mut history = cached.clone();
        let room = n_ctx - session.position() as usize - feed.len();
        let limit = Some(max_new.unwrap_or(room).min(room));
        let stats = generate(&mut session, &tok, &feed, &mut history, limit, &mut sampler, &stop, &mut |s| {
            answer.push_str(s);
            out.write_all(s.as_bytes())?;
            out.flush()?;
            Ok(())
        })?;
        writeln!(out)?;
        // The cache now holds the prompt and the answer (the end-of-turn token, if any, was
        // not fed); the next render is compared against exactly that.
        cached.extend_from_slice(&feed);
        cached.extend_from_slice(&history[history.len() - stats.generated..]);
        cached.truncate(session.position() as usize);
        messages.push(Message::new("assistant", answer.trim()));
        match stats.stop {
            StopReason::Interrupted => eprintln!("(stopped)"),
            StopReason::ContextFull => eprintln!("(the context is full; the oldest turns will be dropped next time)"),
            _ => {}
        }
        tracing::info!(
            "prompt {} tokens {:.1} tok/s, answer {} tokens {:.1} tok/s",
            stats.prompt_tokens,
            stats.prompt_tokens as f64 / stats.prompt_secs.max(1e-9),
            stats.generated,
            stats.generated as f64 / stats.gen_secs.max(1e-9)
        );
    }
    Ok(())
}
