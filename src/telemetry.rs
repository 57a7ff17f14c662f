//! Logging: one `tracing` subscriber for the whole process, writing to stderr.
//!
//! In a cluster the log pipeline wants one JSON object per line
//! (`timestamp`, `level`, `target`, `fields`, `span`); on a terminal people
//! want readable text. The filter comes from `RUST_LOG` so operators can
//! turn up one module without a rebuild; the default keeps kube-rs' own
//! chatter (watch restarts etc.) at `warn`.

use std::io::IsTerminal as _;
use std::sync::OnceLock;

use tracing::Subscriber;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer};

/// Filter used when `RUST_LOG` is unset or empty.
pub const DEFAULT_FILTER: &str = "info,kube=warn";

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line, for log collectors.
    #[default]
    Json,
    /// Human-readable text, for terminals.
    Text,
}

/// Set once the first [`init`] has installed the global subscriber.
static INSTALLED: OnceLock<()> = OnceLock::new();

/// Installs the global subscriber. A second call (tests, or a library user
/// that already initialised us) is a no-op and returns `Ok`.
///
/// Fails if `RUST_LOG` is set but does not parse: silently falling back
/// would hide the operator's intent.
pub fn init(format: LogFormat) -> crate::Result<()> {
    if INSTALLED.get().is_some() {
        return Ok(());
    }
    let filter = filter_from(std::env::var("RUST_LOG").ok().as_deref())?;
    let ansi = std::io::stderr().is_terminal();
    let result = tracing_subscriber::registry()
        .with(filter)
        .with(layer(format, std::io::stderr, ansi))
        .try_init();
    match result {
        Ok(()) => {
            let _ = INSTALLED.set(());
            Ok(())
        }
        // Someone (a test harness, another init racing us) already set a
        // global subscriber; logs still go somewhere, so this is not an error.
        Err(_) if INSTALLED.get().is_some() || tracing::dispatcher::has_been_set() => Ok(()),
        Err(e) => Err(crate::Error::Telemetry(e.to_string())),
    }
}

/// The `EnvFilter` for a `RUST_LOG` value (`None`/empty: [`DEFAULT_FILTER`]).
fn filter_from(rust_log: Option<&str>) -> crate::Result<EnvFilter> {
    let directives = match rust_log.map(str::trim) {
        None | Some("") => DEFAULT_FILTER,
        Some(v) => v,
    };
    EnvFilter::try_new(directives)
        .map_err(|e| crate::Error::invalid("RUST_LOG", format!("{directives:?}: {e}")))
}

/// The formatting layer for `format`, writing to `writer`; split out so
/// tests can capture exactly what production would print.
fn layer<S, W>(format: LogFormat, writer: W, ansi: bool) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    match format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .flatten_event(false)
            .boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(Escaped(writer))
            .with_ansi(ansi)
            .with_target(true)
            .boxed(),
    }
}

/// Text lines with control characters escaped: names from the cluster
/// (a RayService, a field manager) end up in log fields, and a newline or an
/// escape sequence in one must not forge a log line or rewrite a terminal.
/// JSON needs none of this: its encoder escapes them already.
struct Escaped<W>(W);

impl<'a, W: MakeWriter<'a>> MakeWriter<'a> for Escaped<W> {
    type Writer = EscapedWriter<W::Writer>;
    fn make_writer(&'a self) -> Self::Writer {
        EscapedWriter(self.0.make_writer())
    }
}

struct EscapedWriter<W>(W);

/// One formatted event (the formatter writes each whole): every control
/// character but the final newline becomes `\u{..}`, ANSI colouring
/// excepted when it is ours (only written to a terminal).
fn escape_line(buf: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(buf);
    let (body, end) = match text.strip_suffix('\n') {
        Some(b) => (b, "\n"),
        None => (text.as_ref(), ""),
    };
    let mut out = String::with_capacity(body.len() + 1);
    for c in body.chars() {
        if c.is_control() && c != '\u{1b}' {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    out.push_str(end);
    out.into_bytes()
}

impl<W: std::io::Write> std::io::Write for EscapedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write_all(&escape_line(buf))?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A `MakeWriter` into a shared buffer.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buf {
        type Writer = Buf;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    impl Buf {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn capture(format: LogFormat) -> String {
        let buf = Buf::default();
        let subscriber = tracing_subscriber::registry()
            .with(filter_from(Some("debug")).unwrap())
            .with(layer(format, buf.clone(), false));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("reconcile", upgradeplan = "ml/p1");
            let _g = span.enter();
            tracing::info!(phase = "Upgrading", "phase changed");
        });
        buf.text()
    }

    #[test]
    fn json_is_one_object_per_line_with_the_agreed_keys() {
        let out = capture(LogFormat::Json);
        let lines: Vec<_> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert!(v["timestamp"].is_string(), "{v}");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["target"], module_path!());
        assert_eq!(v["fields"]["message"], "phase changed");
        assert_eq!(v["fields"]["phase"], "Upgrading");
        assert_eq!(v["span"]["name"], "reconcile");
        assert_eq!(v["span"]["upgradeplan"], "ml/p1");
    }

    #[test]
    fn text_is_readable_and_uncoloured_off_terminal() {
        let out = capture(LogFormat::Text);
        assert!(out.contains("INFO"), "{out}");
        assert!(out.contains("reconcile{upgradeplan=\"ml/p1\"}"), "{out}");
        assert!(out.contains("phase changed phase=\"Upgrading\""), "{out}");
        assert!(!out.contains('\u{1b}'), "no ANSI escapes: {out:?}");
        assert!(serde_json::from_str::<serde_json::Value>(out.trim()).is_err());
    }

    #[test]
    fn text_escapes_control_characters_so_lines_cannot_be_forged() {
        let buf = Buf::default();
        let subscriber = tracing_subscriber::registry()
            .with(filter_from(Some("debug")).unwrap())
            .with(layer(LogFormat::Text, buf.clone(), false));
        tracing::subscriber::with_default(subscriber, || {
            let forged = "llm\n2026-12-02T00:00:00Z  INFO raygate: gate released\u{7}";
            tracing::info!(rayservice = %forged, "status updated");
        });
        let out = buf.text();
        assert_eq!(out.lines().count(), 1, "{out:?}");
        assert!(out.contains("llm\\u{a}2026"), "{out:?}");
        assert!(out.contains("\\u{7}"), "{out:?}");
        assert!(out.ends_with('\n'));
    }

    #[test]
    fn filter_default_and_invalid() {
        assert_eq!(
            filter_from(None).unwrap().to_string(),
            filter_from(Some(DEFAULT_FILTER)).unwrap().to_string()
        );
        assert_eq!(
            filter_from(Some("  ")).unwrap().to_string(),
            filter_from(None).unwrap().to_string()
        );
        let err = filter_from(Some("raygate=loud")).unwrap_err().to_string();
        assert!(err.starts_with("RUST_LOG:"), "{err}");
    }

    #[test]
    fn init_twice_is_fine() {
        init(LogFormat::Text).unwrap();
        init(LogFormat::Json).unwrap();
        assert!(tracing::dispatcher::has_been_set());
    }
}
