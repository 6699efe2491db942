//! te's one catalog of transports. [`Protocol`]: Mooncake's protocol names (`initialize`,
//! `installTransport`, TENT's hints) and the te transport each selects. [`make`]: each
//! transport made by its catalog name ([`ENTRIES`]), with the options its maker takes. The
//! bindings (through te-facade), TENT and te-bench all make their transports here; which ones
//! they install, and in what order, stays their decision.
//!
//! A transport this build lacks is an error naming the Cargo feature that brings it; a name
//! that is no entry is an error listing the entries.

#![forbid(unsafe_code)]

mod protocol;

use std::path::Path;
use std::sync::Arc;

use te_core::transport::Transport;
use te_core::{Config, Error, HostBuffer, Result};

pub use protocol::Protocol;

/// Memory a transport allocates for peers to reach directly (shared memory, a CXL device).
pub type Allocator = Arc<dyn Fn(usize) -> Result<Arc<HostBuffer>> + Send + Sync>;

/// Every catalog name, with the Cargo feature that brings its transport.
pub const ENTRIES: [(&str, &str); 11] = [
    ("tcp", "tcp"),
    ("rdma", "rdma"),
    ("shm", "shm"),
    ("cma", "shm"),
    ("uring", "uring"),
    ("bufio", "uring"),
    ("file", "uring"),
    ("cxl", "cxl"),
    ("nvlink", "nvlink"),
    ("mnnvl", "nvlink"),
    ("gds", "gds"),
];

/// What the makers take beyond a name.
pub struct Options<'a> {
    /// The engine's configuration (`cxl` maps the device it names).
    pub config: &'a Config,
    /// Where variables are read (`rdma`'s and `nvlink`'s `MC_*` options): the process
    /// environment, or TENT's configuration mapped onto them.
    pub lookup: &'a dyn Fn(&str) -> Option<String>,
    /// The RDMA devices to use (`None`: all).
    pub devices: Option<Vec<String>>,
    /// Where `shm` makes its files (`None`: `/dev/shm`).
    pub shm_dir: Option<&'a Path>,
}

/// A transport made, not yet installed, with its allocator where it has one.
pub struct Made {
    /// The transport.
    pub transport: Arc<dyn Transport>,
    /// Memory it allocates for peers (`shm`, `cxl`).
    pub allocator: Option<Allocator>,
}

impl Made {
    #[allow(dead_code)] // a build without transports makes none
    fn plain(transport: Arc<dyn Transport>) -> Result<Made> {
        Ok(Made {
            transport,
            allocator: None,
        })
    }
}

/// The transport the catalog names `name`:
/// - `tcp`, `rdma` (on `options.devices`, with `MC_*` verbs options), `gds`;
/// - `shm` (files in `options.shm_dir`) and `cxl` (the device `options.config` names), each
///   with its allocator; `cma` (cross-memory attach for memory the application allocated);
/// - `uring` (io_uring), `bufio` (buffered I/O) and `file` (io_uring where the kernel allows
///   it, else buffered I/O), for file segments;
/// - `nvlink` (CUDA IPC, `MC_*` options) and `mnnvl` (fabric handles across hosts).
///
/// # Errors
/// [`Error::NotSupportedTransport`] for a name that is no entry, or a transport this build
/// lacks (its feature named); the maker's error when it cannot be made (bad options, no
/// device).
pub fn make(name: &str, options: &Options<'_>) -> Result<Made> {
    let _ = options;
    match name {
        #[cfg(feature = "tcp")]
        "tcp" => Made::plain(Arc::new(te_tcp::TcpTransport::new())),
        #[cfg(feature = "rdma")]
        "rdma" => {
            let mut o = te_rdma::RdmaOptions::from_lookup(options.lookup)?;
            if options.devices.is_some() {
                o.devices = options.devices.clone();
            }
            Made::plain(Arc::new(te_rdma::RdmaTransport::new(o)))
        }
        #[cfg(feature = "shm")]
        "shm" => {
            let dir = options.shm_dir.unwrap_or(Path::new("/dev/shm"));
            let shm = Arc::new(te_shm::ShmTransport::new(dir));
            let allocator = shm.clone();
            Ok(Made {
                transport: shm,
                allocator: Some(Arc::new(move |len| allocator.allocate(len))),
            })
        }
        #[cfg(feature = "shm")]
        "cma" => Made::plain(Arc::new(te_shm::CmaTransport::new())),
        #[cfg(feature = "uring")]
        "uring" => Made::plain(Arc::new(te_uring::UringTransport::new(
            te_uring::FileOptions::default(),
        )?)),
        #[cfg(feature = "uring")]
        "bufio" => Made::plain(Arc::new(te_uring::BufIoTransport::new(
            te_uring::FileOptions::default(),
        ))),
        #[cfg(feature = "uring")]
        "file" => Made::plain(te_uring::file_transport(te_uring::FileOptions::default())),
        #[cfg(feature = "cxl")]
        "cxl" => {
            let cxl = Arc::new(te_cxl::CxlTransport::open(options.config)?);
            let allocator = cxl.clone();
            Ok(Made {
                transport: cxl,
                allocator: Some(Arc::new(move |len| allocator.allocate(len))),
            })
        }
        #[cfg(feature = "nvlink")]
        "nvlink" | "mnnvl" => {
            let mut o = te_nvlink::NvlinkOptions::from_lookup(options.lookup)?;
            if name == "mnnvl" {
                (o.mnnvl, o.use_fabric) = (true, true);
            }
            Made::plain(Arc::new(te_nvlink::NvlinkTransport::with_options(o)))
        }
        #[cfg(feature = "gds")]
        "gds" => Made::plain(Arc::new(te_gds::GdsTransport::new())),
        other => Err(Error::NotSupportedTransport(
            match ENTRIES.iter().find(|(n, _)| *n == other) {
                Some((_, feature)) => {
                    format!("transport {other}: te was built without its `{feature}` feature")
                }
                None => format!(
                    "no transport is named {other:?} (te's: {})",
                    ENTRIES.map(|(n, _)| n).join(", ")
                ),
            },
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(config: &Config) -> Options<'_> {
        Options {
            config,
            lookup: &|_| None,
            devices: None,
            shm_dir: None,
        }
    }

    #[test]
    fn names_are_made_or_refused_by_name() {
        let config = Config::default();
        let err = |name: &str| match make(name, &options(&config)) {
            Err(Error::NotSupportedTransport(why)) => why,
            Err(e) => panic!("{name}: {e}"),
            Ok(_) => panic!("{name}: made"),
        };
        assert!(err("carrier-pigeon").contains("\"carrier-pigeon\""));
        assert!(err("carrier-pigeon").contains("tcp, rdma"));
        for (name, feature) in ENTRIES {
            match make(name, &options(&config)) {
                Ok(made) => assert_eq!(
                    made.transport.name(),
                    match name {
                        "mnnvl" => "nvlink",
                        "file" => made.transport.name(),
                        other => other,
                    },
                    "{name}"
                ),
                Err(Error::NotSupportedTransport(why)) => {
                    assert!(why.contains(&format!("`{feature}`")), "{name}: {why}");
                }
                // Built in, but not possible here (no CXL device configured, no io_uring).
                Err(e) => assert!(matches!(name, "cxl" | "uring"), "{name}: {e}"),
            }
        }
    }

    /// A variable the maker cannot honour is named, never taken for a missing device.
    #[cfg(feature = "rdma")]
    #[test]
    fn a_bad_variable_is_an_error_naming_it() {
        let config = Config::default();
        let options = Options {
            config: &config,
            lookup: &|name| (name == "MC_IB_PORT").then(|| "0".to_string()),
            devices: None,
            shm_dir: None,
        };
        match make("rdma", &options) {
            Err(Error::InvalidConfig { name, .. }) => assert_eq!(name, "MC_IB_PORT"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("made with MC_IB_PORT=0"),
        }
    }

    #[test]
    fn shm_comes_with_its_allocator() {
        let config = Config::default();
        match make("shm", &options(&config)) {
            Ok(made) => {
                let alloc = made.allocator.expect("an allocator");
                assert_eq!(alloc(4096).unwrap().len(), 4096);
            }
            Err(Error::NotSupportedTransport(why)) => assert!(why.contains("`shm`"), "{why}"),
            Err(e) => panic!("{e}"),
        }
    }
}
