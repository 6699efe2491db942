//! Mooncake's RPC communicator (`RpcInterface`) over te-rpc, for every binding: its
//! `initialize` with a listen address, thread count, timeout and pool size; a server started
//! (`start_server_async`) or started and waited on (`start_server`, which returns once
//! `stop_server` is called); sends that return 0 or a negative code.
//!
//! What it does better than the wheel: a send whose call failed returns a negative code (the
//! wheel's returns 0 once its connection was made), `start_server` waits without holding the
//! caller's interpreter, a listen address that does not parse fails `initialize` by name, and
//! under te's cluster secret (`MC_TE_CLUSTER_SECRET`) te peers prove it both ways and Mooncake
//! peers are served only from `MC_TE_MOONCAKE_ALLOW`.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use te_rpc::{Client, Config, Done, Handler, Outgoing, Owned, Server};

/// Where Mooncake's `create_rpc_server` listens.
pub const MOONCAKE_DEFAULT_SERVER: &str = "0.0.0.0:8080";

#[derive(Default)]
struct State {
    config: Option<Config>,
    listen: String,
    client: Option<Client>,
    server: Option<Server>,
}

/// One `RpcInterface`.
pub struct MooncakeRpc {
    state: Mutex<State>,
    stopped: Condvar,
    handler: Arc<dyn Handler>,
}

impl std::fmt::Debug for MooncakeRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("MooncakeRpc")
            .field("listen", &s.listen)
            .field("serving", &s.server.as_ref().map(Server::local_addr))
            .finish()
    }
}

impl MooncakeRpc {
    /// An uninitialized communicator whose server hands what it receives to `handler`.
    pub fn new(handler: Arc<dyn Handler>) -> Self {
        MooncakeRpc {
            state: Mutex::default(),
            stopped: Condvar::new(),
            handler,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Mooncake's `initialize(listen_address, thread_count, timeout_seconds, pool_size)`: the
    /// settings (and te's variables); an empty address makes a client only. False, logged with
    /// the reason, for a value te cannot honour.
    pub fn initialize(
        &self,
        listen: &str,
        threads: usize,
        timeout_secs: u64,
        pool_size: usize,
    ) -> bool {
        match self.configure(listen, threads, timeout_secs, pool_size) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(error = %e, "RpcInterface.initialize refused");
                false
            }
        }
    }

    fn configure(
        &self,
        listen: &str,
        threads: usize,
        timeout_secs: u64,
        pool_size: usize,
    ) -> te_rpc::Result<()> {
        let mut config = Config::from_env()?;
        config.threads = threads;
        config.timeout = Duration::from_secs(timeout_secs);
        config.pool_size = pool_size;
        config.check()?;
        if !listen.is_empty() {
            te_rpc::resolve(listen)?;
        }
        let client = Client::new(config.clone())?;
        let mut s = self.lock();
        if let Some(old) = s.client.replace(client) {
            old.stop();
        }
        s.config = Some(config);
        s.listen = listen.to_string();
        Ok(())
    }

    /// Mooncake's `start_server_async`: listens and serves on the server's threads. False
    /// (logged) before `initialize`, without a listen address, or when it cannot listen; true
    /// when already serving.
    pub fn start_server(&self) -> bool {
        let mut s = self.lock();
        if s.server.is_some() {
            return true;
        }
        let Some(config) = &s.config else {
            tracing::error!("RpcInterface.start_server before initialize");
            return false;
        };
        if s.listen.is_empty() {
            tracing::error!("RpcInterface.start_server: initialized without a listen address");
            return false;
        }
        match Server::start(&s.listen, config, self.handler.clone()) {
            Ok(server) => {
                s.server = Some(server);
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "RpcInterface.start_server failed");
                false
            }
        }
    }

    /// Waits until the server is stopped, at most `limit` (Mooncake's blocking `start_server`,
    /// after it started, waits in these steps so that its caller can look at signals between
    /// them): whether it is stopped.
    pub fn wait_stopped(&self, limit: Duration) -> bool {
        let s = self.lock();
        let (s, _) = self
            .stopped
            .wait_timeout_while(s, limit, |s| s.server.is_some())
            .unwrap_or_else(PoisonError::into_inner);
        s.server.is_none()
    }

    /// Where the server listens, while it does.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.lock().server.as_ref().map(Server::local_addr)
    }

    /// Mooncake's `stop_server`: closes the server's connections; sends still work.
    pub fn stop_server(&self) {
        let server = self.lock().server.take();
        if let Some(server) = server {
            server.stop();
        }
        self.stopped.notify_all();
    }

    fn client(&self) -> Option<Client> {
        self.lock().client.clone()
    }

    /// Sends and waits for the peer's handler: 0, or the negative code of [`te_rpc::Error::code`]
    /// (-1 before `initialize`).
    pub fn send(&self, target: &str, what: Outgoing<'_>) -> i32 {
        self.try_send(target, what)
            .map_or_else(|e| e.code(), |()| 0)
    }

    /// As [`MooncakeRpc::send`], with the error.
    ///
    /// # Errors
    /// te-rpc's, or `Stopped` before `initialize`.
    pub fn try_send(&self, target: &str, what: Outgoing<'_>) -> te_rpc::Result<()> {
        let client = self.client().ok_or(te_rpc::Error::Stopped)?;
        let r = client.send(target, what);
        if let Err(e) = &r {
            tracing::debug!(error = %e, target, "RPC send failed");
        }
        r
    }

    /// Sends on the client's sending threads and calls `done` with the outcome there.
    ///
    /// # Errors
    /// `Stopped` before `initialize` or after the client stopped (`done` is not called).
    pub fn send_then(&self, target: &str, what: Owned, done: Done) -> te_rpc::Result<()> {
        let client = self.client().ok_or(te_rpc::Error::Stopped)?;
        client.send_then(target, what, done)
    }
}

impl MooncakeRpc {
    /// Stops the server and the client (their threads joined). A binding whose handler needs
    /// a lock its caller holds (Python's GIL) calls this without holding it, before the drop.
    pub fn shutdown(&self) {
        self.stop_server();
        let client = self.lock().client.take();
        if let Some(c) = client {
            c.stop();
        }
    }
}

impl Drop for MooncakeRpc {
    fn drop(&mut self) {
        self.shutdown();
    }
}
