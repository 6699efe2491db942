//! Mooncake's transport names (the `protocol` of `initialize` and `installTransport`, TENT's
//! `transport_hint`) and the te transport each selects. A name te has no transport for, or
//! cannot install from its bindings, is an error naming it: never a silent TCP engine.

use te_core::Result;

/// A kind of transport, as Mooncake names select it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Protocol {
    /// `tcp`.
    Tcp,
    /// `rdma`.
    Rdma,
    /// `nvlink`: GPU memory on one host.
    Nvlink,
    /// `nvlink_intra`: GPU memory on one host (Mooncake's intra-node NVLink transport).
    NvlinkIntra,
    /// `mnnvl`: GPU memory across a multi-node NVLink fabric.
    Mnnvl,
    /// `cxl`: a CXL memory device.
    Cxl,
    /// `shm`: shared memory on one host (TENT).
    Shm,
    /// `io_uring`: file segments (TENT).
    IoUring,
    /// `gds`: GPUDirect Storage (TENT).
    Gds,
    /// `auto` (te's): every transport that can start here, chosen per segment and buffer.
    Auto,
}

/// Every name [`Protocol::parse`] accepts, and what it selects.
const NAMES: [(&str, Protocol); 10] = [
    ("tcp", Protocol::Tcp),
    ("rdma", Protocol::Rdma),
    ("nvlink", Protocol::Nvlink),
    ("nvlink_intra", Protocol::NvlinkIntra),
    ("mnnvl", Protocol::Mnnvl),
    ("cxl", Protocol::Cxl),
    ("shm", Protocol::Shm),
    ("io_uring", Protocol::IoUring),
    ("gds", Protocol::Gds),
    ("auto", Protocol::Auto),
];

/// Mooncake's names for transports te does not have, and what they are.
const ELSEWHERE: [(&str, &str); 16] = [
    ("efa", "AWS Elastic Fabric Adapter"),
    ("cxi", "HPE Slingshot (CXI)"),
    ("hip", "AMD GPU (HIP)"),
    ("xgmi", "AMD GPU (xGMI)"),
    ("maca", "MetaX GPU (MACA)"),
    ("musa", "Moore Threads GPU (MUSA)"),
    ("ascend", "Huawei Ascend"),
    ("ascend_direct", "Huawei Ascend"),
    ("ub", "Huawei UB"),
    ("ubshmem", "Huawei UB shared memory"),
    ("barex", "Alibaba BarEx"),
    ("nvmeof", "NVMe over Fabrics (Mooncake's classic nvmeof)"),
    ("nccl", "NCCL"),
    ("sunrise_link", "Sunrise link"),
    ("tpu", "TPU"),
    ("mpcomm", "MPComm"),
];

impl Protocol {
    /// The transport a Mooncake protocol name selects (ASCII case ignored, surrounding
    /// blanks too).
    ///
    /// # Errors
    /// A Mooncake name te has no transport for, or a name that is no transport at all; the
    /// message names it and lists te's.
    pub fn parse(name: &str) -> Result<Self> {
        let wanted = name.trim();
        if let Some((_, p)) = NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(wanted)) {
            return Ok(*p);
        }
        let known = NAMES.map(|(n, _)| n).join(", ");
        let why = match ELSEWHERE
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(wanted))
        {
            Some((_, what)) => format!("{what}: te has no such transport (te's: {known})"),
            None => format!("not a transport name (te's: {known})"),
        };
        Err(te_core::Error::NotSupportedTransport(format!(
            "protocol {wanted:?}: {why}"
        )))
    }

    /// A `transport_hint`: none for `""` and `"unspec"`, else as [`parse`](Self::parse).
    ///
    /// # Errors
    /// As [`parse`](Self::parse).
    pub fn parse_hint(hint: &str) -> Result<Option<Self>> {
        match hint.trim() {
            "" => Ok(None),
            h if h.eq_ignore_ascii_case("unspec") || h.eq_ignore_ascii_case("auto") => Ok(None),
            h => Self::parse(h).map(Some),
        }
    }

    /// TENT's transport number (`tent_request.transport_hint`, TENT's `TransportType`): 0 is
    /// none.
    ///
    /// # Errors
    /// A number TENT gives a transport te does not have, or none at all.
    pub fn from_tent_number(n: i32) -> Result<Option<Self>> {
        let name = match n {
            0 => return Ok(None),
            1 => "rdma",
            2 => "mnnvl",
            3 => "shm",
            4 => "nvlink",
            5 => "gds",
            6 => "io_uring",
            7 => "tcp",
            8 => "ascend",
            9 => "sunrise_link",
            10 => "tpu",
            11 => "ub",
            12 => "mpcomm",
            other => {
                return Err(te_core::Error::NotSupportedTransport(format!(
                    "TENT transport number {other}: not one of TENT's (0-12)"
                )));
            }
        };
        Self::parse(name).map(Some)
    }

    /// Mooncake's name for it.
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(_, p)| *p == self)
            .map_or("?", |(n, _)| n)
    }

    /// The names te's transport of this kind may go by once installed (file segments use
    /// `bufio` where io_uring is refused).
    pub fn transports(self) -> &'static [&'static str] {
        match self {
            Protocol::IoUring => &["uring", "bufio"],
            Protocol::Tcp => &["tcp"],
            Protocol::Rdma => &["rdma"],
            Protocol::Nvlink | Protocol::NvlinkIntra | Protocol::Mnnvl => &["nvlink"],
            Protocol::Cxl => &["cxl"],
            Protocol::Shm => &["shm"],
            Protocol::Gds => &["gds"],
            Protocol::Auto => &[],
        }
    }

    /// The catalog entry ([`crate::make`]) that makes te's transport of this kind: `file` for
    /// `io_uring` (io_uring where allowed, buffered I/O else), `mnnvl` for fabric handles.
    pub fn entry(self) -> &'static str {
        match self {
            Protocol::IoUring => "file",
            Protocol::Mnnvl => "mnnvl",
            other => other.transport(),
        }
    }

    /// The name of te's transport of this kind (what [`te_core::transport::Transport::name`]
    /// says once it is installed).
    pub fn transport(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Rdma => "rdma",
            Protocol::Nvlink | Protocol::NvlinkIntra | Protocol::Mnnvl => "nvlink",
            Protocol::Cxl => "cxl",
            Protocol::Shm => "shm",
            Protocol::IoUring => "uring",
            Protocol::Gds => "gds",
            Protocol::Auto => "auto",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Protocol;

    #[test]
    fn mooncake_names_select_te_transports() {
        let cases = [
            ("tcp", "tcp"),
            ("RDMA", "rdma"),
            (" nvlink ", "nvlink"),
            ("nvlink_intra", "nvlink"),
            ("mnnvl", "nvlink"),
            ("cxl", "cxl"),
            ("shm", "shm"),
            ("io_uring", "uring"),
            ("gds", "gds"),
            ("Auto", "auto"),
        ];
        for (name, transport) in cases {
            assert_eq!(
                Protocol::parse(name).unwrap().transport(),
                transport,
                "{name}"
            );
        }
        assert_eq!(
            Protocol::parse("nvlink_intra").unwrap().name(),
            "nvlink_intra"
        );
        assert_eq!(Protocol::parse("MNNVL").unwrap().name(), "mnnvl");
        // `auto` as a hint is no hint: the engine chooses, as it does without one.
        assert_eq!(Protocol::parse_hint("auto").unwrap(), None);
        assert_eq!(Protocol::IoUring.transports(), ["uring", "bufio"]);
    }

    #[test]
    fn names_te_cannot_serve_are_errors_that_name_them() {
        for (name, says) in [
            ("efa", "Elastic Fabric"),
            ("hip", "HIP"),
            ("ascend", "Ascend"),
            ("barex", "BarEx"),
            ("ub", "UB"),
            ("bogus", "not a transport name"),
            ("tpc", "not a transport name"),
            ("", "not a transport name"),
        ] {
            let e = Protocol::parse(name).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains(&format!("{name:?}")) && text.contains(says),
                "{text}"
            );
            assert!(
                matches!(e, te_core::Error::NotSupportedTransport(_)),
                "{e:?}"
            );
        }
    }

    #[test]
    fn hints_and_tent_numbers() {
        assert_eq!(Protocol::parse_hint("").unwrap(), None);
        assert_eq!(Protocol::parse_hint("unspec").unwrap(), None);
        assert_eq!(
            Protocol::parse_hint("io_uring").unwrap(),
            Some(Protocol::IoUring)
        );
        assert!(Protocol::parse_hint("rdam").is_err());
        assert_eq!(Protocol::from_tent_number(0).unwrap(), None);
        assert_eq!(Protocol::from_tent_number(7).unwrap(), Some(Protocol::Tcp));
        assert_eq!(
            Protocol::from_tent_number(6).unwrap(),
            Some(Protocol::IoUring)
        );
        assert!(
            Protocol::from_tent_number(8)
                .unwrap_err()
                .to_string()
                .contains("ascend")
        );
        assert!(Protocol::from_tent_number(13).is_err());
        assert!(Protocol::from_tent_number(-1).is_err());
    }
}
