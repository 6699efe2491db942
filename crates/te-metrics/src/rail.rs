//! [`RailCounters`]: the load of one local rail (a NIC or device) as transports count it for
//! `nic_load_stats`: bytes in flight (posted, not yet ended), bytes done, path errors, and a
//! smoothed bandwidth of completions.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// How a slice posted on a rail ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Its bytes moved.
    Done,
    /// The path failed (the rail is charged an error).
    PathFailed,
    /// Anything else (refused, canceled): no bytes, no error charged to the rail.
    Other,
}

/// One rail's load at a moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RailLoad {
    /// The rail's name (an interface, or a device).
    pub name: String,
    /// Bytes posted and not yet ended.
    pub inflight_bytes: u64,
    /// Bytes that moved.
    pub bytes_done: u64,
    /// Slices whose path failed.
    pub errors: u64,
    /// Smoothed bandwidth of completions, bytes per second.
    pub ewma_bandwidth_bps: f64,
    /// Paused after repeated errors (the engine's rail health, or the transport's own).
    pub paused: bool,
}

/// Weight of the newest sample in the bandwidth average.
const EWMA_ALPHA: f64 = 0.2;
/// Bytes are summed over at least this long before they become a bandwidth sample.
const SAMPLE_SECS: f64 = 0.01;

/// Counters of one local rail.
pub struct RailCounters {
    name: String,
    inflight: AtomicU64,
    done: AtomicU64,
    errors: AtomicU64,
    /// (average bytes/s, bytes in the open sample, when the sample opened).
    bandwidth: Mutex<(f64, u64, Instant)>,
}

impl RailCounters {
    /// Zeroed counters for the rail `name`.
    pub fn new(name: String) -> Self {
        RailCounters {
            name,
            inflight: AtomicU64::new(0),
            done: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            bandwidth: Mutex::new((0.0, 0, Instant::now())),
        }
    }

    /// `len` bytes posted on the rail.
    pub fn posted(&self, len: u64) {
        self.inflight.fetch_add(len, Ordering::Relaxed);
    }

    /// `len` bytes posted before ended `how`.
    pub fn settled(&self, len: u64, how: Settled) {
        self.inflight.fetch_sub(len, Ordering::Relaxed);
        match how {
            Settled::Done => {
                self.done.fetch_add(len, Ordering::Relaxed);
                let mut bw = self.bandwidth.lock().unwrap_or_else(|e| e.into_inner());
                bw.1 += len;
                let elapsed = bw.2.elapsed().as_secs_f64();
                if elapsed >= SAMPLE_SECS {
                    let rate = bw.1 as f64 / elapsed;
                    bw.0 = if bw.0 == 0.0 {
                        rate
                    } else {
                        EWMA_ALPHA * rate + (1.0 - EWMA_ALPHA) * bw.0
                    };
                    bw.1 = 0;
                    bw.2 = Instant::now();
                }
            }
            Settled::PathFailed => {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
            Settled::Other => {}
        }
    }

    /// What the rail carries now and carried so far.
    pub fn stats(&self) -> RailLoad {
        RailLoad {
            name: self.name.clone(),
            inflight_bytes: self.inflight.load(Ordering::Relaxed),
            bytes_done: self.done.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            ewma_bandwidth_bps: self.bandwidth.lock().unwrap_or_else(|e| e.into_inner()).0,
            paused: false,
        }
    }
}
