//! What the communicator's tests share: a server whose handler queues what it takes, a client,
//! and a minimal executor for the futures.

#![allow(dead_code)]

use std::future::Future;
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use te_rpc::{Client, Config, Received, Server};

/// A server on loopback and what it receives.
pub fn server(config: &Config) -> (Server, Receiver<Received>) {
    let (tx, rx) = channel();
    let tx = std::sync::Mutex::new(tx);
    let handler = move |m: Received| {
        let _ = tx.lock().unwrap().send(m);
    };
    let s = Server::start("127.0.0.1:0", config, Arc::new(handler)).expect("the server starts");
    (s, rx)
}

/// A configuration with a short timeout.
pub fn quick() -> Config {
    Config {
        timeout: Duration::from_secs(3),
        threads: 2,
        ..Config::default()
    }
}

/// A client with `config`.
pub fn client(config: Config) -> Client {
    Client::new(config).expect("the client starts")
}

/// The next message, within a few seconds.
pub fn next(rx: &Receiver<Received>) -> Received {
    rx.recv_timeout(Duration::from_secs(10))
        .expect("a message arrives")
}

/// Two cluster keys (stretching a secret is slow: once per test binary).
pub fn key(which: usize) -> te_rpc::ClusterKey {
    static KEYS: OnceLock<[te_rpc::ClusterKey; 2]> = OnceLock::new();
    KEYS.get_or_init(|| {
        [
            te_rpc::ClusterKey::from_secret("one cluster's secret, long enough").unwrap(),
            te_rpc::ClusterKey::from_secret("another cluster's secret, long too").unwrap(),
        ]
    })[which]
        .clone()
}

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs a future to its end on this thread.
pub fn block_on<F: Future>(f: F) -> F::Output {
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(Duration::from_millis(100));
    }
}

/// Bytes that say where they are.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    te_testkit::pattern(seed, len)
}
