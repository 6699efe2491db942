//! te's log for C programs: events at `MC_LOG_LEVEL` (WARNING unless set) and above go to
//! standard error, as Mooncake's library logs through glog, so a failed call says why. Installed
//! at the first call into the library; a program that installed its own `tracing` subscriber
//! first keeps it.

use std::sync::OnceLock;

use te_core::config::LogLevel;

/// Installs the log once per process.
pub(crate) fn init() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let level = LogLevel::from_env();
        let max = match level {
            Ok(Some(LogLevel::Trace)) => tracing::Level::TRACE,
            Ok(Some(LogLevel::Debug)) => tracing::Level::DEBUG,
            Ok(Some(LogLevel::Info)) => tracing::Level::INFO,
            Ok(Some(LogLevel::Error)) => tracing::Level::ERROR,
            _ => tracing::Level::WARN,
        };
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(max)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .finish();
        // Refused only when the program installed its own: then its subscriber gets te's events.
        let _ = tracing::subscriber::set_global_default(subscriber);
        if let Err(e) = level {
            tracing::warn!("{e}; logging at WARNING");
        }
    });
}
