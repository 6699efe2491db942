//! The etcd backend (feature `etcd`): the `etcd-client` crate over gRPC, driven from te's
//! blocking API by a one-thread tokio runtime that belongs to this backend. Endpoints are
//! Mooncake's (`etcd://h1:2379,h2:2379`, or a bare `host:port`); every call has a timeout, so an
//! unreachable cluster is an error, not a hang.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use crate::KvStore;
use crate::{KvError as Error, Result};

/// An etcd cluster holding descriptors.
pub struct EtcdStore {
    endpoints: String,
    runtime: tokio::runtime::Runtime,
    client: Client,
    timeout: Duration,
    max_len: usize,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .finish()
    }
}

impl EtcdStore {
    /// A client for the comma-separated `endpoints` (`h1:2379,h2:2379`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no endpoint, [`Error::Metadata`] when the client cannot be
    /// set up.
    pub fn new(endpoints: &str, timeout: Duration, max_len: usize) -> Result<Self> {
        let list: Vec<String> = endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| match e.contains("://") {
                true => e.to_string(),
                false => format!("http://{e}"),
            })
            .collect();
        if list.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "etcd://{endpoints}: no endpoint"
            )));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("te-etcd")
            .enable_all()
            .build()
            .map_err(|e| Error::Metadata(format!("etcd runtime: {e}")))?;
        let options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout);
        let client = runtime
            .block_on(Client::connect(&list, Some(options)))
            .map_err(|e| Error::Metadata(format!("etcd://{endpoints}: {e}")))?;
        Ok(EtcdStore {
            endpoints: endpoints.to_string(),
            runtime,
            client,
            timeout,
            max_len,
        })
    }

    fn fail(&self, what: String) -> Error {
        Error::Metadata(format!("etcd://{}: {what}", self.endpoints))
    }

    /// Runs one call with the backend's timeout.
    fn call<T, F>(&self, what: &str, f: impl FnOnce(Client) -> F) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let fut = f(self.client.clone());
        let timeout = self.timeout;
        match self
            .runtime
            .block_on(async move { tokio::time::timeout(timeout, fut).await })
        {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.fail(format!("{what}: {e}"))),
            Err(_) => Err(self.fail(format!("{what}: no answer within {timeout:?}"))),
        }
    }
}

impl KvStore for EtcdStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let k = key.to_string();
        let resp = self.call(&format!("get {key}"), |mut c| async move {
            c.get(k, None).await
        })?;
        match resp.kvs().first() {
            Some(kv) if kv.value().len() > self.max_len => Err(Error::MalformedMessage(format!(
                "{key}: {} bytes exceed the limit of {}",
                kv.value().len(),
                self.max_len
            ))),
            Some(kv) => Ok(Some(kv.value().to_vec())),
            None => Ok(None),
        }
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        let (k, v) = (key.to_string(), value.to_vec());
        self.call(&format!("put {key}"), |mut c| async move {
            c.put(k, v, None).await
        })
        .map(|_| ())
    }

    fn delete(&self, key: &str) -> Result<()> {
        let k = key.to_string();
        self.call(&format!("delete {key}"), |mut c| async move {
            c.delete(k, None).await
        })
        .map(|_| ())
    }

    fn describe(&self) -> String {
        format!("etcd://{}", self.endpoints)
    }
}
