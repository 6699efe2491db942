//! te-metadata: the HTTP metadata server Mooncake deployments run beside their engines, speaking
//! Mooncake's REST protocol on one path (default `/metadata`):
//!
//! - `GET <path>?key=K`: 200 and the value, or 404 when absent;
//! - `PUT <path>?key=K` (or `POST`) with the value as body: 200;
//! - `DELETE <path>?key=K`: 200, or 404 when absent.
//!
//! With a persistence file, every change is written to a temporary file, synced and renamed
//! over it before the reply, so a restart loses nothing. Requests are bounded (head 16 KiB, value
//! `max_value`), connections are capped, and a bad request gets a 4xx without disturbing others.
//! It does not authenticate clients: run it on a trusted network (te's cluster secret keeps
//! segment secrets out of what it stores).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use te_core::metadata::http::{percent_decode, read_body, read_head};
use tracing::{debug, info, warn};

/// Settings of a server.
#[derive(Clone, Debug)]
pub struct Options {
    /// The path requests must use (`/metadata`).
    pub path: String,
    /// Where to keep the keys across restarts, if anywhere.
    pub persist: Option<PathBuf>,
    /// Largest value accepted, bytes.
    pub max_value: usize,
    /// Connections served at once.
    pub max_connections: usize,
    /// Connections the kernel holds before they are accepted (the listener's backlog; Linux
    /// caps it at `net.core.somaxconn`): a cluster's engines starting together connect at once,
    /// and the standard library's 128 would drop their SYNs for a second.
    pub backlog: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            path: "/metadata".into(),
            persist: None,
            max_value: 16 << 20,
            max_connections: 256,
            backlog: 4096,
        }
    }
}

/// The keys and where they persist.
struct Store {
    map: Mutex<BTreeMap<String, String>>,
    persist: Option<PathBuf>,
}

impl Store {
    fn load(persist: Option<PathBuf>) -> std::io::Result<Store> {
        let map = match &persist {
            Some(p) if p.exists() => {
                let bytes = std::fs::read(p)?;
                serde_json::from_slice(&bytes).map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{}: not a JSON object of strings: {e}", p.display()),
                    )
                })?
            }
            _ => BTreeMap::new(),
        };
        Ok(Store {
            map: Mutex::new(map),
            persist,
        })
    }

    /// Writes the map next to the file, syncs, and renames it over the file.
    fn save(path: &Path, map: &BTreeMap<String, String>) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        let json = serde_json::to_vec(map).map_err(std::io::Error::other)?;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&json)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    }

    /// Applies `change` and persists it before returning; a failed save undoes nothing in
    /// memory but is reported, so the client learns the write is not durable.
    fn change<T>(
        &self,
        change: impl FnOnce(&mut BTreeMap<String, String>) -> T,
    ) -> std::io::Result<T> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let out = change(&mut map);
        if let Some(p) = &self.persist {
            Store::save(p, &map)?;
        }
        Ok(out)
    }
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("addr", &self.addr).finish()
    }
}

impl Server {
    /// Serves on `listener` with `options`, loading the persistence file if there is one.
    ///
    /// # Errors
    /// The persistence file cannot be read or is not a JSON object of strings.
    pub fn start(listener: TcpListener, options: Options) -> std::io::Result<Server> {
        let store = Arc::new(Store::load(options.persist.clone())?);
        te_core::sys::set_listen_backlog(&listener, options.backlog)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let options = Arc::new(options);
        let active = Arc::new(AtomicUsize::new(0));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("te-metadata-accept".into())
                .spawn(move || {
                    for conn in listener.incoming() {
                        if stop.load(Ordering::Acquire) {
                            return;
                        }
                        let Ok(conn) = conn else { continue };
                        if active.load(Ordering::Acquire) >= options.max_connections {
                            let _ = respond(&conn, 503, "too many connections");
                            continue;
                        }
                        active.fetch_add(1, Ordering::AcqRel);
                        let (store, options, active) =
                            (store.clone(), options.clone(), active.clone());
                        let spawned = std::thread::Builder::new()
                            .name("te-metadata-conn".into())
                            .spawn(move || {
                                serve(conn, &store, &options);
                                active.fetch_sub(1, Ordering::AcqRel);
                            });
                        if spawned.is_err() {
                            warn!("could not spawn a connection thread");
                        }
                    }
                })?
        };
        info!(%addr, "metadata server listening");
        Ok(Server {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting (connections in progress finish).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn respond(mut conn: &TcpStream, status: u16, body: &str) -> std::io::Result<()> {
    respond_bytes(&mut conn, status, body.as_bytes(), false)
}

fn respond_bytes(
    conn: &mut impl Write,
    status: u16,
    body: &[u8],
    keep: bool,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        500 => "Internal Server Error",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\nContent-Type: application/json\r\nConnection: {}\r\n\r\n",
        body.len(),
        if keep { "keep-alive" } else { "close" }
    );
    conn.write_all(head.as_bytes())?;
    conn.write_all(body)?;
    conn.flush()
}

/// The key of a request target `path?key=...`, when the path is ours.
fn key_of(target: &str, path: &str) -> Result<String, (u16, &'static str)> {
    let (p, query) = target.split_once('?').unwrap_or((target, ""));
    if p != path {
        return Err((404, "unknown path"));
    }
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("key="))
        .ok_or((400, "missing key"))
        .and_then(|k| percent_decode(k).ok_or((400, "bad key encoding")))
        .and_then(|k| match k.is_empty() {
            true => Err((400, "empty key")),
            false => Ok(k),
        })
}

/// Serves requests on one connection until it closes, errs, or asks to close.
fn serve(conn: TcpStream, store: &Store, options: &Options) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let peer = conn.peer_addr().ok();
    let mut writer = match conn.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(conn);
    loop {
        let head = match read_head(&mut reader) {
            Ok(Some(h)) => h,
            Ok(None) => return,
            Err(e) => {
                debug!(?peer, error = %e, "bad request head");
                let _ = respond_bytes(&mut writer, 400, e.to_string().as_bytes(), false);
                return;
            }
        };
        let mut parts = head.first_line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let keep = !head
            .header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"));
        let body = match read_body(&mut reader, &head, options.max_value, false) {
            Ok(b) => b,
            Err(e) => {
                let _ = respond_bytes(&mut writer, 413, e.to_string().as_bytes(), false);
                return;
            }
        };
        let (status, reply): (u16, Vec<u8>) = match key_of(target, &options.path) {
            Err((status, why)) => (status, why.as_bytes().to_vec()),
            Ok(key) => match method {
                "GET" => match store
                    .map
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&key)
                {
                    Some(v) => (200, v.as_bytes().to_vec()),
                    None => (404, b"metadata not found".to_vec()),
                },
                "PUT" | "POST" => match String::from_utf8(body) {
                    Err(_) => (400, b"value is not UTF-8".to_vec()),
                    Ok(value) => match store.change(|m| m.insert(key.clone(), value)) {
                        Ok(_) => (200, b"metadata updated".to_vec()),
                        Err(e) => (500, format!("not persisted: {e}").into_bytes()),
                    },
                },
                "DELETE" => match store.change(|m| m.remove(&key)) {
                    Ok(Some(_)) => (200, b"metadata deleted".to_vec()),
                    Ok(None) => (404, b"metadata not found".to_vec()),
                    Err(e) => (500, format!("not persisted: {e}").into_bytes()),
                },
                _ => (405, b"method not allowed".to_vec()),
            },
        };
        debug!(?peer, method, status, "request");
        // After a bad request the connection is closed: its framing may be off.
        let keep = keep && status < 400;
        if respond_bytes(&mut writer, status, &reply, keep).is_err() || !keep {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listener_takes_the_configured_backlog() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let options = Options {
            backlog: 1000,
            ..Options::default()
        };
        let server = Server::start(listener, options).unwrap();
        assert_eq!(
            te_core::testing::listen_backlog(server.addr().port()),
            ["1000"]
        );
    }

    #[test]
    fn keys_come_from_the_query() {
        assert_eq!(
            key_of("/metadata?key=mooncake%2Fram%2Fa", "/metadata").unwrap(),
            "mooncake/ram/a"
        );
        assert_eq!(key_of("/metadata?x=1&key=b", "/metadata").unwrap(), "b");
        assert_eq!(key_of("/other?key=b", "/metadata").unwrap_err().0, 404);
        assert_eq!(key_of("/metadata", "/metadata").unwrap_err().0, 400);
        assert_eq!(key_of("/metadata?key=", "/metadata").unwrap_err().0, 400);
        assert_eq!(key_of("/metadata?key=%zz", "/metadata").unwrap_err().0, 400);
    }
}
