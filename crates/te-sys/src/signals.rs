//! SIGINT and SIGTERM for te's programs (te-bench, te-metadata): caught, so the program exits
//! through its own code and its destructors run. Engines then delete their descriptors from
//! the metadata service and close their listeners; shared-memory buffers remove their files.
//!
//! [`Termination::install`] blocks both signals in the calling thread, which every thread it
//! starts afterwards inherits (so call it first in `main`), and starts one thread that waits
//! for them with `sigwait`. No handler runs in signal context. The first signal is recorded for
//! the program to see ([`Termination::received`], [`Termination::wait`]); if the program is
//! still running a grace period later, or a second signal arrives, the process exits at once
//! with status 128 + the signal, as a shell reports a killed program. Libraries never install
//! this: the application owns its signals.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The termination signals of this process, once installed.
#[derive(Clone)]
pub struct Termination {
    received: Arc<(Mutex<Option<i32>>, Condvar)>,
    /// The first signal (0 before one): what timed loops poll, without taking the lock.
    first: Arc<AtomicI32>,
}

fn termination_set() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set it is given; sigaddset adds valid signal numbers
    // to that initialised set. The set is a plain value owned here.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

impl Termination {
    /// Blocks SIGINT and SIGTERM in this thread (and the threads it starts from now on) and
    /// starts the thread that waits for them. After the first, the process exits with 128 +
    /// the signal if it has not exited within `grace`, or at a second signal.
    ///
    /// # Errors
    /// The signal mask could not be changed, or the thread could not start.
    pub fn install(grace: Duration) -> std::io::Result<Self> {
        let set = termination_set();
        // SAFETY: `set` is an initialised signal set; the old mask is not asked for (null).
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        let me = Termination {
            received: Arc::new((Mutex::new(None), Condvar::new())),
            first: Arc::new(AtomicI32::new(0)),
        };
        let shared = me.clone();
        std::thread::Builder::new()
            .name("te-signals".into())
            .spawn(move || shared.watch(set, grace))?;
        Ok(me)
    }

    fn watch(&self, set: libc::sigset_t, grace: Duration) {
        loop {
            let mut signal: libc::c_int = 0;
            // SAFETY: `set` is initialised and blocked in every thread of the program (they
            // inherit the mask of the thread that installed it); `signal` is a valid out-pointer.
            let rc = unsafe { libc::sigwait(&set, &mut signal) };
            if rc != 0 {
                continue;
            }
            let (lock, cv) = &*self.received;
            let mut received = lock.lock().unwrap_or_else(|e| e.into_inner());
            if received.is_some() {
                tracing::warn!(signal, "second termination signal: exiting at once");
                std::process::exit(128 + signal);
            }
            tracing::info!(signal, "termination signal: shutting down");
            *received = Some(signal);
            self.first.store(signal, Ordering::Release);
            cv.notify_all();
            drop(received);
            let _ = std::thread::Builder::new()
                .name("te-signals-grace".into())
                .spawn(move || {
                    std::thread::sleep(grace);
                    tracing::warn!(
                        signal,
                        ?grace,
                        "still running after the grace period: exiting"
                    );
                    std::process::exit(128 + signal);
                });
        }
    }

    /// The signal received, if one was.
    pub fn received(&self) -> Option<i32> {
        match self.first.load(Ordering::Acquire) {
            0 => None,
            signal => Some(signal),
        }
    }

    /// Blocks until a termination signal arrives; returns it.
    pub fn wait(&self) -> i32 {
        let (lock, cv) = &*self.received;
        let mut received = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(s) = *received {
                return s;
            }
            received = cv.wait(received).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Waits up to `timeout` for a termination signal; returns it if one came.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<i32> {
        let (lock, cv) = &*self.received;
        let received = lock.lock().unwrap_or_else(|e| e.into_inner());
        let (received, _) = cv
            .wait_timeout_while(received, timeout, |r| r.is_none())
            .unwrap_or_else(|e| e.into_inner());
        *received
    }

    /// The name of signal `signal` (`SIGINT`, `SIGTERM`), for messages.
    pub fn name(signal: i32) -> &'static str {
        match signal {
            libc::SIGINT => "SIGINT",
            libc::SIGTERM => "SIGTERM",
            _ => "a signal",
        }
    }
}
