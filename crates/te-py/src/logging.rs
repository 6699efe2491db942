//! Rust `tracing` events of te's crates into Python's `logging`: each event becomes a record of
//! the logger `te.<crate>` (`te.te_tcp`, ...) at the matching level, with its fields after the
//! message. Events are handed to one forwarding thread through a bounded queue, so a thread of
//! the engine never waits for the GIL (and never deadlocks on it) to log; when the queue is
//! full, events are dropped and counted, and the count is logged with the next one that fits.
//!
//! The level is Python's choice: `te` sets it from the `te` logger's effective level when the
//! package is imported, and `te.set_log_level` changes it at any time.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};

use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::{Context, SubscriberExt};

/// Events waiting for the forwarding thread.
const QUEUE: usize = 4096;

struct Record {
    level: i32,
    target: String,
    message: String,
}

struct Forward {
    tx: SyncSender<Record>,
    dropped: AtomicU64,
}

static INSTALLED: OnceLock<bool> = OnceLock::new();
/// The lowest Python level forwarded (10 DEBUG ... 40 ERROR; above 50: nothing).
static LEVEL: AtomicI32 = AtomicI32::new(30);

/// The message and fields of an event, as one line.
#[derive(Default)]
struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" if self.0.is_empty() => {
                let _ = write!(self.0, "{value:?}");
            }
            "message" => {
                let _ = write!(self.0, " {value:?}");
            }
            name => {
                let _ = write!(self.0, " {name}={value:?}");
            }
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.0.insert_str(0, value),
            name => {
                let _ = write!(self.0, " {name}={value}");
            }
        }
    }
}

/// Python's number for a tracing level.
fn py_level(level: &Level) -> i32 {
    match *level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        _ => 10,
    }
}

impl<S: Subscriber> Layer<S> for Forward {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut line = Line::default();
        event.record(&mut line);
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            let _ = write!(
                line.0,
                " ({dropped} earlier te log records dropped: queue full)"
            );
        }
        let record = Record {
            level: py_level(meta.level()),
            target: meta.target().split("::").next().unwrap_or("te").to_string(),
            message: line.0,
        };
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(record)
        {
            self.dropped.fetch_add(1 + dropped, Ordering::Relaxed);
        }
    }
}

fn forward(rx: Receiver<Record>) {
    for r in rx {
        // Never during interpreter shutdown: the record is dropped then.
        let _ = Python::try_attach(|py| -> PyResult<()> {
            let logger = py
                .import("logging")?
                .call_method1("getLogger", (format!("te.{}", r.target),))?;
            logger.call_method1("log", (r.level, r.message))?;
            Ok(())
        });
    }
}

/// Sends te's events at `level` (Python's number: 10 DEBUG ... 40 ERROR, 60 none) and above
/// to Python's `logging`; may be called again to change the level. False when another
/// subscriber had been installed first (te's events then go there).
#[pyfunction]
pub(crate) fn enable_logging(level: i32) -> bool {
    LEVEL.store(level, Ordering::Relaxed);
    let installed = *INSTALLED.get_or_init(|| {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let layer = Forward {
            tx,
            dropped: AtomicU64::new(0),
        }
        .with_filter(filter_fn(|meta| {
            py_level(meta.level()) >= LEVEL.load(Ordering::Relaxed)
        }));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::set_global_default(subscriber).is_ok()
            && std::thread::Builder::new()
                .name("te-py-logging".into())
                .spawn(move || forward(rx))
                .is_ok()
    });
    // The filter's answer is cached per call site: ask every call site again.
    tracing::callsite::rebuild_interest_cache();
    installed
}
