//! `kiln chat`: an interactive conversation on a [`Conversation`]: the KV cache carries over
//! between turns; when the context fills up, the oldest turns are dropped.

use std::io::{BufRead, Write};
use std::sync::atomic::Ordering;

use crate::chat::{ChatTemplate, Conversation};
use crate::cli::load::{load_model, open_session, ModelArgs};
use crate::cli::run::{interrupt_flag, SamplingArgs, TextArgs};
use crate::generate::StopReason;
use crate::{KilnError, Result};

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// System prompt (llama.cpp's -sys).
    #[arg(long = "system-prompt", visible_alias = "system")]
    pub system: Option<String>,
    /// Chat template: chatml, llama2, llama3 or zephyr (default: the model's own).
    #[arg(long = "chat-template")]
    pub chat_template: Option<String>,
    /// Most tokens per answer (-1: until the model ends its turn).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_hyphen_values = true)]
    pub n_predict: i64,
    #[command(flatten)]
    pub text: TextArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

pub fn run(args: &ChatArgs) -> Result<()> {
    args.sampling.config()?;
    let mut margs = args.model.clone();
    let (model, tok) = load_model(&mut margs)?;
    let bos = tok.bos().and_then(|b| tok.token_str(b)).unwrap_or("").to_string();
    let eos = tok.eos().and_then(|b| tok.token_str(b)).unwrap_or("").to_string();
    let tmpl = ChatTemplate::select(&model.file, args.chat_template.as_deref(), bos, eos)?;
    let mut session = open_session(&model, &margs, 64, false)?;
    let n_ctx = session.opts.n_ctx as usize;
    let stop = interrupt_flag();
    let mut sampler = args.sampling.sampler(&tok)?;
    let max_new = if args.n_predict < 0 { None } else { Some(args.n_predict as usize) };
    let system = args.system.as_deref().map(|s| args.text.text(s));
    let mut conv = Conversation::new(system.as_deref());
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
                conv.reset(&mut session);
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        stop.store(false, Ordering::SeqCst);
        let mut out = std::io::stdout().lock();
        let mut stops = args.text.stop_strings();
        let mut stopped_at_string = false;
        let turn = conv.turn(&mut session, &tmpl, &tok, input, max_new, &mut sampler, &stop, &mut |s| {
            let (show, hit) = stops.push(s);
            out.write_all(&s.as_bytes()[..show])?;
            out.flush()?;
            if hit {
                // Ends the answer after this token, as Ctrl-C would.
                stopped_at_string = true;
                stop.store(true, Ordering::SeqCst);
            }
            Ok(())
        });
        let turn = match turn {
            Ok(t) => t,
            Err(e @ KilnError::InvalidInput { .. }) => {
                eprintln!("kiln: {e}");
                continue;
            }
            Err(e) => return Err(e),
        };
        writeln!(out)?;
        if turn.dropped > 0 {
            let s = if turn.dropped == 1 { "" } else { "s" };
            eprintln!("(context full: dropped the {} oldest turn{s})", turn.dropped);
        }
        let stats = turn.stats;
        match stats.stop {
            StopReason::Interrupted if !stopped_at_string => eprintln!("(stopped)"),
            StopReason::ContextFull => eprintln!("(the context is full; the oldest turns will be dropped next time)"),
            _ => {}
        }
        tracing::info!("{}", crate::cli::run::speed_line(&stats));
    }
    crate::cli::load::report_profile(&session)?;
    Ok(())
}
