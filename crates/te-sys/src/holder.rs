//! Who holds what on this host, read from `/proc`: the process at the other end of a TCP
//! connection within the host ([`holds_other_end`]), and whether a process maps a given file
//! ([`maps_file`]). te-core uses them to bind what a descriptor names on this host (a pid, a
//! shared-memory file, a device) to the process that served that descriptor over the exact
//! connection te used: a name can be re-resolved by anyone, a connection's 4-tuple cannot.
//!
//! Reading another process's `/proc/<pid>/fd` and `maps` needs the right to ptrace-read it (the
//! same user, or root); where that is missing the answer is "no", never a guess.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};

/// A file's identity: its device and inode, as `stat` gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl FileId {
    /// The identity of an open file.
    ///
    /// # Errors
    /// `fstat` failed.
    pub fn of(file: &std::fs::File) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = file.metadata()?;
        Ok(FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// The identity of the file at `path`, symbolic links not followed.
    ///
    /// # Errors
    /// `lstat` failed.
    pub fn of_path(path: &std::path::Path) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(path)?;
        Ok(FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// `st_dev` as `/proc/<pid>/maps` prints it: `major:minor` in hex.
    fn maps_device(&self) -> String {
        let (major, minor) = (libc::major(self.dev), libc::minor(self.dev));
        format!("{major:02x}:{minor:02x}")
    }
}

/// Whether process `pid` holds the other end of `stream`, an established TCP connection whose
/// peer is an address of this host: the socket at the peer's address connected to this end's
/// address (one 4-tuple, in this network namespace) must be among `pid`'s open files.
///
/// # Errors
/// Why not, in words: the peer is not on this host, no such socket is listed (the peer closed
/// it), or `pid` does not hold it (or its files cannot be read).
pub fn holds_other_end(stream: &TcpStream, pid: u32) -> Result<(), String> {
    let (mine, theirs) = match (stream.local_addr(), stream.peer_addr()) {
        (Ok(l), Ok(p)) => (canonical(l), canonical(p)),
        (Err(e), _) | (_, Err(e)) => return Err(format!("the connection's addresses: {e}")),
    };
    if !on_this_host(theirs.ip()) {
        return Err(format!("{theirs} is not an address of this host"));
    }
    let inodes: Vec<u64> = ["/proc/self/net/tcp", "/proc/self/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|table| established(&table, theirs, mine))
        .collect();
    if inodes.is_empty() {
        return Err(format!(
            "no socket at {theirs} is connected to {mine} (the peer closed it)"
        ));
    }
    let held = socket_inodes(pid).map_err(|e| format!("/proc/{pid}/fd: {e}"))?;
    match inodes.iter().any(|i| held.contains(i)) {
        true => Ok(()),
        false => Err(format!(
            "process {pid} does not hold the socket at {theirs} that served this connection"
        )),
    }
}

/// Whether `ip` is an address of this host: loopback, or one of its interfaces' (in this
/// network namespace).
pub fn on_this_host(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    ip.is_loopback()
        || crate::interface_addrs()
            .iter()
            .any(|a| a.ip.to_canonical() == ip)
}

/// Whether process `pid` maps the file `id` (an entry of `/proc/<pid>/maps`).
///
/// # Errors
/// `/proc/<pid>/maps` cannot be read (no such process, or no right to read it).
pub fn maps_file(pid: u32, id: FileId) -> io::Result<bool> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(mapped_in(&maps, id))
}

/// Whether a `maps` table lists file `id`.
fn mapped_in(maps: &str, id: FileId) -> bool {
    let (dev, ino) = (id.maps_device(), id.ino.to_string());
    maps.lines().any(|line| {
        let mut fields = line.split_whitespace().skip(3);
        fields.next() == Some(dev.as_str()) && fields.next() == Some(ino.as_str())
    })
}

/// An address with an IPv4-mapped IPv6 address read as IPv4 (a dual-stack socket lists its
/// IPv4 peers that way).
fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// The inodes of the sockets process `pid` holds.
fn socket_inodes(pid: u32) -> io::Result<Vec<u64>> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|link| {
            link.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect())
}

/// The inodes of the established connections from `local` to `remote` in a `/proc/net/tcp` or
/// `tcp6` table.
fn established(table: &str, local: SocketAddr, remote: SocketAddr) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let from = table_address(fields.get(1)?)?;
            let to = table_address(fields.get(2)?)?;
            let inode: u64 = fields.get(9)?.parse().ok()?;
            let connected = *fields.get(3)? == "01";
            (connected && inode != 0 && from == local && to == remote).then_some(inode)
        })
        .collect()
}

/// An address as the kernel's tables print it: the address's 32-bit words in hex, each in this
/// host's byte order, then `:` and the port in hex.
fn table_address(field: &str) -> Option<SocketAddr> {
    let (addr, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = addr.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(canonical(SocketAddr::new(ip, port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_addresses_are_read_in_host_order() {
        let v4 = u32::from_ne_bytes([127, 0, 0, 1]);
        assert_eq!(
            table_address(&format!("{v4:08X}:3A98")),
            Some("127.0.0.1:15000".parse().unwrap())
        );
        let words = |ip: Ipv6Addr| -> String {
            ip.octets()
                .chunks(4)
                .map(|c| format!("{:08X}", u32::from_ne_bytes([c[0], c[1], c[2], c[3]])))
                .collect()
        };
        let v6: Ipv6Addr = "fd00::1:2".parse().unwrap();
        assert_eq!(
            table_address(&format!("{}:0050", words(v6))),
            Some(SocketAddr::new(v6.into(), 80))
        );
        let mapped: Ipv6Addr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(
            table_address(&format!("{}:0001", words(mapped))),
            Some("10.1.2.3:1".parse().unwrap()),
            "read as IPv4"
        );
        for bad in ["", "0100007F", "0100007F:XYZ", "0100:0001", "ZZ00007F:0001"] {
            assert_eq!(table_address(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_process_at_the_other_end_is_found_and_no_other() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (served, _) = listener.accept().unwrap();
        let me = std::process::id();
        holds_other_end(&client, me).expect("this process accepted it");
        holds_other_end(&served, me).expect("and connected it");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let err = holds_other_end(&client, child.id()).unwrap_err();
        assert!(err.contains("does not hold"), "{err}");
        child.kill().unwrap();
        child.wait().unwrap();
        // Once the other end is closed, nothing holds it.
        drop(served);
        let err = holds_other_end(&client, me).unwrap_err();
        assert!(
            err.contains("does not hold") || err.contains("closed"),
            "{err}"
        );
    }

    #[test]
    fn a_mapped_file_is_found_by_device_and_inode() {
        let path = std::env::temp_dir().join(format!("te-holder-{}", std::process::id()));
        std::fs::write(&path, [0u8; 4096]).unwrap();
        let id = FileId::of_path(&path).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        assert_eq!(FileId::of(&file).unwrap(), id);
        let me = std::process::id();
        assert!(!maps_file(me, id).unwrap(), "not mapped yet");
        let maps = format!(
            "7f00-7f01 r--s 00000000 {} {}    {}\n",
            id.maps_device(),
            id.ino,
            path.display()
        );
        assert!(mapped_in(&maps, id));
        assert!(!mapped_in(
            &maps,
            FileId {
                ino: id.ino + 1,
                ..id
            }
        ));
        assert!(!mapped_in(
            &maps,
            FileId {
                dev: id.dev + 1,
                ..id
            }
        ));
        assert!(!mapped_in("", id));
        std::fs::remove_file(&path).unwrap();
        assert!(maps_file(u32::MAX, id).is_err(), "no such process");
    }
}
