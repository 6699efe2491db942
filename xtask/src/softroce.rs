//! `cargo xtask softroce [--setup] [OPTIONS] -- CMD [ARGS…]`: runs CMD inside a throw-away qemu
//! guest that boots Debian's kernel with Soft-RoCE (`rdma_rxe`) on virtio NICs, and exits with
//! CMD's exit code. This is how te-rdma is tested against a real verbs stack on machines
//! without RDMA NICs (and without usable KVM: the guest runs under TCG).
//!
//! The guest's root is the host's `/`, read-only over virtio-9p with a RAM overlay, so the
//! host's binaries, libraries (rdma-core, the rxe provider, perftest) and test binaries are
//! where they are on the host; `--share DIR` mounts DIR read-write at the same path. Inside,
//! `ethN` has 198.18.N.1/24 and `rxeN` is bound to it; policy routing makes traffic between
//! rails really cross the NICs (qemu's internal hub, no host network); memlock is unlimited;
//! `SOFTROCE_DEVS` and `SOFTROCE_IPS` list the devices and addresses, `SOFTROCE_VM_GUEST=1`.
//!
//! Exit codes: CMD's; 124 when the guest outlives `--timeout`; 125 when the guest ends without
//! running CMD to the end (a setup failure), named with the step that failed or the console's
//! last lines. The kernel and initramfs are cached in
//! `$TE_SOFTROCE_DIR` (default `/tmp/te-softroce`); `--setup` prepares them (and installs the
//! Debian packages when run as root).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "kmod",
    "cpio",
    "iproute2",
    "rdma-core",
    "libibverbs1",
    "librdmacm1",
    "ibverbs-providers",
    "ibverbs-utils",
    "perftest",
];
/// Modules the initramfs loads itself; the RDMA ones come later from the full module tree.
const INITRD_MODULES: &[&str] = &["virtio_pci", "virtio_net", "9pnet_virtio", "9p", "overlay"];
/// Host variables passed into the guest.
const PASS_ENV: &[&str] = &[
    "PATH",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
    "RUST_BACKTRACE",
    "RUST_LOG",
    "RUST_TEST_THREADS",
    "MC_LOG_LEVEL",
    "TE_SEED",
];

struct Options {
    setup_only: bool,
    shares: Vec<PathBuf>,
    timeout: u64,
    mem: u32,
    smp: usize,
    nics: usize,
    cmd: Vec<String>,
}

fn parse(args: &[&str]) -> Result<Options, String> {
    let usage = "usage: cargo xtask softroce [--setup] [--share DIR]... [--timeout SEC] [--mem MIB] [--smp N] [--nics N] -- CMD [ARGS...]";
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut o = Options {
        setup_only: false,
        shares: Vec::new(),
        timeout: 600,
        mem: 2048,
        smp: cores.min(4),
        nics: 2,
        cmd: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .map(|v| v.to_string())
                .ok_or(format!("{name} needs a value\n{usage}"))
        };
        let number = |name: &str, v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{name} {v}: not a number"))
        };
        match *a {
            "--setup" => o.setup_only = true,
            "--share" => {
                let dir = PathBuf::from(value("--share")?);
                o.shares.push(
                    dir.canonicalize()
                        .map_err(|e| format!("--share {}: {e}", dir.display()))?,
                );
            }
            "--timeout" => o.timeout = number("--timeout", value("--timeout")?)?,
            "--mem" => o.mem = number("--mem", value("--mem")?)? as u32,
            "--smp" => o.smp = number("--smp", value("--smp")?)?.clamp(1, 16) as usize,
            "--nics" => o.nics = number("--nics", value("--nics")?)?.clamp(1, 8) as usize,
            "--" => {
                o.cmd = it.map(|s| s.to_string()).collect();
                break;
            }
            "-h" | "--help" => return Err(usage.into()),
            other => return Err(format!("unknown option {other}\n{usage}")),
        }
    }
    if !o.setup_only && o.cmd.is_empty() {
        return Err(format!("no command given\n{usage}"));
    }
    Ok(o)
}

fn cache_dir() -> PathBuf {
    std::env::var_os("TE_SOFTROCE_DIR")
        .map_or_else(|| PathBuf::from("/tmp/te-softroce"), PathBuf::from)
}

fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

fn install_packages() -> Result<(), String> {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask softroce: installing {}", missing.join(" "));
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !install() {
        crate::run(
            "apt-get update",
            Command::new("apt-get").args(["update", "-qq"]),
        )?;
        if !install() {
            return Err(format!("apt-get install {} failed", missing.join(" ")));
        }
    }
    Ok(())
}

/// Downloads and unpacks Debian's kernel package (once), with its module tree indexed.
fn fetch_kernel(dir: &Path) -> Result<String, String> {
    let kdir = dir.join("kernel");
    if let Ok(kv) = std::fs::read_to_string(kdir.join("version")) {
        return Ok(kv.trim().to_string());
    }
    let meta = std::env::var("TE_SOFTROCE_KMETA").unwrap_or_else(|_| "linux-image-amd64".into());
    let resolve = || -> Option<String> {
        let deps = output(Command::new("apt-cache").args(["depends", &meta])).ok()?;
        deps.lines()
            .filter_map(|l| l.trim().strip_prefix("Depends: "))
            .find(|p| {
                p.starts_with("linux-image-")
                    && p.as_bytes().get(12).is_some_and(u8::is_ascii_digit)
            })
            .map(str::to_string)
    };
    let pkg = match resolve() {
        Some(p) => p,
        None => {
            crate::run(
                "apt-get update",
                Command::new("apt-get").args(["update", "-qq"]),
            )?;
            resolve().ok_or(format!("cannot resolve the kernel package behind {meta}"))?
        }
    };
    eprintln!("xtask softroce: downloading {pkg}");
    let dl = dir.join("download");
    let _ = std::fs::remove_dir_all(&dl);
    let _ = std::fs::remove_dir_all(&kdir);
    std::fs::create_dir_all(&dl).map_err(|e| e.to_string())?;
    // apt's sandbox user writes the download.
    let _ = Command::new("chmod").arg("777").arg(&dl).status();
    crate::run(
        "apt-get download",
        Command::new("apt-get")
            .arg("download")
            .arg(&pkg)
            .current_dir(&dl),
    )?;
    let deb = std::fs::read_dir(&dl)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or("apt-get download left no .deb")?;
    let root = kdir.join("x");
    std::fs::create_dir_all(&kdir).map_err(|e| e.to_string())?;
    crate::run(
        "dpkg-deb -x",
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root),
    )?;
    let kv = std::fs::read_dir(root.join("lib/modules"))
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .ok_or("the kernel package has no modules")?;
    crate::run(
        "depmod",
        Command::new("depmod").arg("-b").arg(&root).arg(&kv),
    )?;
    let _ = std::fs::remove_dir_all(&dl);
    std::fs::write(kdir.join("version"), &kv).map_err(|e| e.to_string())?;
    Ok(kv)
}

const INIT: &str = r#"#!/bin/sh
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
fail() { echo "te softroce initramfs: $*"; poweroff -f; sleep 5; }
for m in $(cat /modules/order); do insmod /modules/$m || echo "insmod $m failed"; done
mkdir -p /mnt/host /mnt/ram
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose host /mnt/host || fail "host root"
mount -t tmpfs -o mode=755 tmpfs /mnt/ram; mkdir -p /mnt/ram/upper /mnt/ram/work
mount -t overlay -o lowerdir=/mnt/host,upperdir=/mnt/ram/upper,workdir=/mnt/ram/work overlay /root || fail "overlay"
mkdir -p /root/run/te-softroce /root/lib/modules/$(uname -r)
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 ctl /root/run/te-softroce || fail "control share"
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose kmods /root/lib/modules/$(uname -r) || fail "modules"
mount --move /dev /root/dev
mkdir -p /root/dev/pts /root/dev/shm
mount -t devpts devpts /root/dev/pts; mount -t tmpfs tmpfs /root/dev/shm
umount /proc /sys
mount -t proc proc /root/proc; mount -t sysfs sysfs /root/sys
exec switch_root /root /bin/bash /run/te-softroce/guest.sh
"#;

/// Builds the initramfs (busybox, the modules that reach the root, `INIT`) unless current.
fn build_initramfs(dir: &Path, kv: &str) -> Result<PathBuf, String> {
    let img = dir.join("initramfs.img");
    let stamp = format!("{kv}-{}", INIT.len());
    if img.exists()
        && std::fs::read_to_string(dir.join("initramfs.stamp")).is_ok_and(|s| s == stamp)
    {
        return Ok(img);
    }
    eprintln!("xtask softroce: building the initramfs");
    let r = dir.join("initramfs.d");
    let _ = std::fs::remove_dir_all(&r);
    for d in ["bin", "dev", "proc", "sys", "mnt", "root", "modules"] {
        std::fs::create_dir_all(r.join(d)).map_err(|e| e.to_string())?;
    }
    std::fs::copy("/bin/busybox", r.join("bin/busybox"))
        .map_err(|e| format!("/bin/busybox: {e}"))?;
    for applet in [
        "sh",
        "mount",
        "umount",
        "mkdir",
        "insmod",
        "switch_root",
        "poweroff",
        "cat",
        "echo",
        "sleep",
    ] {
        std::os::unix::fs::symlink("busybox", r.join("bin").join(applet))
            .map_err(|e| e.to_string())?;
    }
    let tree = dir.join("kernel/x");
    let mut order: Vec<String> = Vec::new();
    for m in INITRD_MODULES {
        let deps = output(Command::new("modprobe").arg("-d").arg(&tree).args([
            "-S",
            kv,
            "--show-depends",
            m,
        ]))?;
        for path in deps
            .lines()
            .filter_map(|l| l.strip_prefix("insmod "))
            .map(|l| l.split_whitespace().next().unwrap_or(""))
        {
            let file = Path::new(path);
            let name = file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            // busybox insmod wants plain .ko: Debian's newer kernels compress modules.
            let (plain, tool) = match name.rsplit_once('.') {
                Some((stem, "xz")) => (stem.to_string(), Some("xz")),
                Some((stem, "zst")) => (stem.to_string(), Some("zstd")),
                Some((stem, "gz")) => (stem.to_string(), Some("gzip")),
                _ => (name.clone(), None),
            };
            if order.contains(&plain) {
                continue;
            }
            let dest = r.join("modules").join(&plain);
            match tool {
                Some(t) => {
                    let out = Command::new(t)
                        .args(["-dc"])
                        .arg(file)
                        .output()
                        .map_err(|e| format!("{t}: {e}"))?;
                    std::fs::write(&dest, out.stdout).map_err(|e| e.to_string())?;
                }
                None => {
                    std::fs::copy(file, &dest).map_err(|e| format!("{}: {e}", file.display()))?;
                }
            }
            order.push(plain);
        }
    }
    std::fs::write(r.join("modules/order"), order.join("\n") + "\n").map_err(|e| e.to_string())?;
    let init = r.join("init");
    std::fs::write(&init, INIT).map_err(|e| e.to_string())?;
    let _ = Command::new("chmod").arg("+x").arg(&init).status();
    let tmp = dir.join("initramfs.img.tmp");
    let script = format!(
        "cd {} && find . | cpio -o -H newc --quiet | gzip -1 > {}",
        r.display(),
        tmp.display()
    );
    crate::run("cpio", Command::new("sh").args(["-c", &script]))?;
    std::fs::rename(&tmp, &img).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("initramfs.stamp"), stamp).map_err(|e| e.to_string())?;
    Ok(img)
}

/// Shell-quotes one word.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The guest's script (PID 1 after switch_root): modules, addresses, rxe devices, rail
/// routing, then CMD; writes CMD's exit code to the control share and powers off. It starts
/// few processes: under TCG each exec costs a noticeable fraction of a second.
fn guest_script(o: &Options, cwd: &Path) -> String {
    let mut ip = String::from("link set lo up\n");
    let mut rdma = String::new();
    let (mut ips, mut devs) = (Vec::new(), Vec::new());
    for n in 0..o.nics {
        ip += &format!("addr add 198.18.{n}.1/24 dev eth{n}\nlink set eth{n} up\n");
        rdma += &format!("link add rxe{n} type rxe netdev eth{n}\n");
        ips.push(format!("198.18.{n}.1"));
        devs.push(format!("rxe{n}"));
    }
    // Without these rules the kernel routes rxe1's packets for rail 0 through lo, where rxe
    // drops them: send traffic bound to ethN for another rail out of ethN instead.
    let mut sysctl = String::new();
    if o.nics > 1 {
        for (k, v) in [
            ("accept_local", 1),
            ("rp_filter", 0),
            ("arp_ignore", 1),
            ("arp_announce", 2),
        ] {
            sysctl += &format!("echo {v} > /proc/sys/net/ipv4/conf/all/{k}\n");
        }
        for n in 0..o.nics {
            sysctl += &format!(
                "echo 1 > /proc/sys/net/ipv4/conf/eth{n}/accept_local\necho 0 > /proc/sys/net/ipv4/conf/eth{n}/rp_filter\n"
            );
            for m in (0..o.nics).filter(|m| *m != n) {
                ip += &format!("route add 198.18.{m}.0/24 dev eth{n} table {}\n", 100 + n);
            }
            ip += &format!("rule add pref {} oif eth{n} lookup {}\n", 10 + n, 100 + n);
        }
        ip += "rule add pref 100 lookup local\nrule del pref 0\n";
    }
    let mut env = String::new();
    for v in PASS_ENV {
        if let Ok(val) = std::env::var(v) {
            env += &format!("export {v}={}\n", quote(&val));
        }
    }
    let mounts: String = o
        .shares
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let p = quote(&p.display().to_string());
            format!("mkdir -p {p}; mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=mmap share{i} {p}\n")
        })
        .collect();
    let cmd: Vec<String> = o.cmd.iter().map(|a| quote(a)).collect();
    format!(
        r#"export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
C=/run/te-softroce
stty -onlcr 2>/dev/null || true
finish() {{ echo "$1" > $C/rc; sync; busybox poweroff -f 2>/dev/null || echo o > /proc/sysrq-trigger; sleep 10; }}
trap 'echo "$BASH_COMMAND" > $C/setup-failed; finish 125' ERR
set -e -o pipefail
echo te-softroce > /proc/sys/kernel/hostname
{mounts}modprobe -a rdma_rxe ib_uverbs rdma_ucm
{sysctl}ip -batch - <<'IP'
{ip}IP
rdma -b - <<'RDMA'
{rdma}RDMA
ulimit -l unlimited
trap - ERR; set +e +o pipefail
{env}export SOFTROCE_IPS={ips} SOFTROCE_DEVS={devs} SOFTROCE_VM_GUEST=1 HOME=/root USER=root TERM=dumb
cd {cwd} 2>/dev/null || cd /
: > $C/started
{cmd} </dev/null 2>&1 | cat
finish ${{PIPESTATUS[0]}}
"#,
        ips = quote(&ips.join(" ")),
        devs = quote(&devs.join(" ")),
        cwd = quote(&cwd.display().to_string()),
        cmd = cmd.join(" "),
    )
}

pub(crate) fn softroce(args: &[&str]) -> Result<i32, String> {
    let o = parse(args)?;
    // Already in a guest (a runner inside `cargo test` in the guest): just run the command.
    if std::env::var_os("SOFTROCE_VM_GUEST").is_some() && !o.setup_only {
        let status = Command::new(&o.cmd[0])
            .args(&o.cmd[1..])
            .status()
            .map_err(|e| e.to_string())?;
        return Ok(status.code().unwrap_or(125));
    }
    let dir = cache_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // Packages are installed only as root (`id -u`: xtask has no unsafe code for geteuid).
    if output(Command::new("id").arg("-u")).is_ok_and(|u| u.trim() == "0") {
        install_packages()?;
    }
    let kv = fetch_kernel(&dir)?;
    let initramfs = build_initramfs(&dir, &kv)?;
    if o.setup_only {
        eprintln!("xtask softroce: ready in {}", dir.display());
        return Ok(0);
    }
    // A guest that failed before CMD started (a boot or setup hiccup under TCG) is booted once
    // more; one that failed while running CMD is not.
    let mut ending = boot(&o, &dir, &kv, &initramfs)?;
    if let Ending::Failed {
        started: false,
        why,
    } = &ending
    {
        eprintln!("xtask softroce: {why}\nxtask softroce: booting once more");
        ending = boot(&o, &dir, &kv, &initramfs)?;
    }
    match ending {
        Ending::Exited(rc) => Ok(rc),
        Ending::TimedOut => {
            eprintln!("xtask softroce: the guest ran past {} s", o.timeout);
            Ok(124)
        }
        Ending::Failed { why, .. } => Err(why),
    }
}

/// How one boot of the guest ended.
enum Ending {
    /// CMD ran to the end with this exit code.
    Exited(i32),
    /// The guest outlived `--timeout` and was stopped.
    TimedOut,
    /// The guest ended without CMD's exit code: why, and whether CMD had started.
    Failed { started: bool, why: String },
}

/// Boots the guest once to run `o.cmd`.
fn boot(o: &Options, dir: &Path, kv: &str, initramfs: &Path) -> Result<Ending, String> {
    let ctl = dir.join(format!("run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&ctl);
    std::fs::create_dir_all(&ctl).map_err(|e| e.to_string())?;
    let cwd = std::env::current_dir().map_err(|e| e.to_string())?;
    std::fs::write(ctl.join("guest.sh"), guest_script(o, &cwd)).map_err(|e| e.to_string())?;
    let kvm =
        Path::new("/sys/module/kvm_intel").exists() || Path::new("/sys/module/kvm_amd").exists();
    let accel: &[&str] = match kvm {
        true => &["-accel", "kvm", "-cpu", "host"],
        false => &["-accel", "tcg,thread=multi,tb-size=256", "-cpu", "max"],
    };
    let modules = dir.join("kernel/x/lib/modules").join(kv);
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args(accel)
        .args([
            "-machine",
            "q35",
            "-m",
            &o.mem.to_string(),
            "-smp",
            &o.smp.to_string(),
        ])
        .args([
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
            "-serial",
            "stdio",
        ])
        .arg("-kernel")
        .arg(dir.join("kernel/x/boot").join(format!("vmlinuz-{kv}")))
        .arg("-initrd")
        .arg(initramfs)
        .args([
            "-append",
            "console=ttyS0 quiet loglevel=3 panic=-1 net.ifnames=0 mitigations=off",
        ])
        .args([
            "-fsdev",
            "local,id=host,path=/,security_model=none,readonly=on,multidevs=remap",
        ])
        .args(["-device", "virtio-9p-pci,fsdev=host,mount_tag=host"])
        .args([
            "-fsdev",
            &format!(
                "local,id=kmods,path={},security_model=none,readonly=on",
                modules.display()
            ),
        ])
        .args(["-device", "virtio-9p-pci,fsdev=kmods,mount_tag=kmods"])
        .args([
            "-fsdev",
            &format!("local,id=ctl,path={},security_model=none", ctl.display()),
        ])
        .args(["-device", "virtio-9p-pci,fsdev=ctl,mount_tag=ctl"]);
    for (i, s) in o.shares.iter().enumerate() {
        qemu.args([
            "-fsdev",
            &format!(
                "local,id=share{i},path={},security_model=none,multidevs=remap",
                s.display()
            ),
        ])
        .args([
            "-device",
            &format!("virtio-9p-pci,fsdev=share{i},mount_tag=share{i}"),
        ]);
    }
    for n in 0..o.nics {
        qemu.args(["-netdev", &format!("hubport,id=net{n},hubid=0")])
            .args([
                "-device",
                &format!(
                    "virtio-net-pci,netdev=net{n},mac=52:54:00:12:34:{:02x}",
                    n + 1
                ),
            ]);
    }
    eprintln!(
        "xtask softroce: booting {kv} ({}), {} NIC(s)",
        if kvm { "kvm" } else { "tcg" },
        o.nics
    );
    let mut child = qemu
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("qemu-system-x86_64: {e}"))?;
    let console = child
        .stdout
        .take()
        .map(|out| std::thread::spawn(|| echo_console(out)));
    let deadline = Instant::now() + Duration::from_secs(o.timeout);
    let timed_out = loop {
        if child.try_wait().map_err(|e| e.to_string())?.is_some() {
            break false;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break true;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let rc = std::fs::read_to_string(ctl.join("rc"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok());
    let setup = std::fs::read_to_string(ctl.join("setup-failed")).ok();
    let started = ctl.join("started").exists();
    let _ = std::fs::remove_dir_all(&ctl);
    let tail = console.and_then(|t| t.join().ok()).unwrap_or_default();
    Ok(match (rc, setup, timed_out) {
        (Some(_), Some(step), _) => Ending::Failed {
            started: false,
            why: format!(
                "the guest's setup failed at `{}`; its console's last lines:\n{tail}",
                step.trim()
            ),
        },
        (Some(rc), None, _) => Ending::Exited(rc),
        (None, _, true) => Ending::TimedOut,
        (None, _, false) => Ending::Failed {
            started,
            why: format!(
                "the guest ended without an exit code ({}); its console's last lines:\n{tail}",
                match started {
                    true => "while running the command",
                    false => "before the command started",
                }
            ),
        },
    })
}

/// Console lines kept for the error when the guest ends early.
const CONSOLE_TAIL: usize = 20;

/// Copies the guest's console to stdout as it comes; returns its last [`CONSOLE_TAIL`] lines.
fn echo_console(out: std::process::ChildStdout) -> String {
    use std::io::{BufRead, Write};
    let mut tail = std::collections::VecDeque::with_capacity(CONSOLE_TAIL);
    let mut stdout = std::io::stdout();
    for line in std::io::BufReader::new(out)
        .split(b'\n')
        .map_while(Result::ok)
    {
        let _ = stdout
            .write_all(&line)
            .and_then(|()| stdout.write_all(b"\n"));
        if tail.len() == CONSOLE_TAIL {
            tail.pop_front();
        }
        tail.push_back(String::from_utf8_lossy(&line).trim_end().to_string());
    }
    match tail.is_empty() {
        true => "(it printed nothing)".to_string(),
        false => Vec::from(tail).join("\n"),
    }
}

/// CI's RDMA lane: builds te-rdma's device tests on the host, then runs them (`--ignored`) in
/// one Soft-RoCE guest.
pub(crate) fn rdma_lane() -> Result<(), String> {
    // te-rdma's device tests, its interoperability tests against Mooncake's wheel (RDMA both
    // ways), and te's Python APIs over RDMA (where te's Python environment is), in one guest.
    let tests = ["rdma", "mooncake"];
    let mut cmd = crate::cargo();
    cmd.args(["test", "-p", "te-rdma", "--no-run", "--message-format=json"]);
    for t in tests {
        cmd.args(["--test", t]);
    }
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cargo test --no-run: {e}"))?;
    if !out.status.success() {
        return Err("building te-rdma's tests failed".into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let bins = tests
        .iter()
        .map(|name| {
            text.lines()
                .filter(|l| {
                    l.contains("\"executable\":\"") && l.contains(&format!("\"name\":\"{name}\""))
                })
                .find_map(|l| {
                    let at = l.find("\"executable\":\"")? + 14;
                    l[at..].split('"').next().map(str::to_string)
                })
                .ok_or(format!("cargo did not name te-rdma's {name} test binary"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut steps = bins
        .iter()
        .map(|b| format!("{b} --ignored --test-threads=1"))
        .collect::<Vec<_>>();
    let python = Path::new(crate::ci::TE_PYTHON);
    if python.exists() {
        crate::ci::install_te_py()?;
        steps.push(format!(
            "PYTHONDONTWRITEBYTECODE=1 {} -m pytest -q -p no:cacheprovider crates/te-py/tests/test_rdma.py",
            python.display()
        ));
    } else {
        eprintln!(
            "xtask: te's Python APIs over RDMA: skipped ({} missing)",
            python.display()
        );
    }
    let script = steps.join(" && ");
    let rc = softroce(&["--timeout", "1500", "--", "sh", "-c", &script])?;
    match rc {
        0 => Ok(()),
        rc => Err(format!(
            "te-rdma's tests in the Soft-RoCE guest exited {rc}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_the_guest_script() {
        let o = parse(&[
            "--nics",
            "2",
            "--timeout",
            "30",
            "--",
            "ibv_devinfo",
            "-d",
            "rxe0's",
        ])
        .unwrap();
        assert_eq!((o.nics, o.timeout, o.cmd.len()), (2, 30, 3));
        let script = guest_script(&o, Path::new("/work/x"));
        assert!(script.contains("link add rxe1 type rxe netdev eth1"));
        assert!(script.contains("route add 198.18.0.0/24 dev eth1 table 101"));
        assert!(script.contains(r"'rxe0'\''s'"), "arguments are quoted");
        assert!(
            script.contains(r#"trap 'echo "$BASH_COMMAND" > $C/setup-failed; finish 125' ERR"#),
            "a failed setup step is named for the host"
        );
        assert!(parse(&["--",]).is_err());
        assert!(parse(&["--bogus"]).is_err());
        assert!(parse(&["--setup"]).unwrap().setup_only);
    }
}
