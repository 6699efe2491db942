//! A runtime policy installed in the engine (te-tent's TENT is one): every allocation, submit,
//! registration and free through the engine reaches it; its own posts (`planned`) do not come
//! back to it; a registration it refuses is undone; once it is gone the engine plans alone.

use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use te_core::memory::Region;
use te_core::transport::Capabilities;
use te_core::{
    BatchId, Config, Error, HostBuffer, Notification, Opcode, Permission, Policy, SubmitOptions,
    TransferEngine, TransferRequest, TransferState,
};
use te_testkit::SimTransport;

const LEN: u64 = 64 << 10;

/// Posts every submit through `mover`, and writes down what the engine told and asked.
#[derive(Default)]
struct Recorder {
    engine: OnceLock<Weak<TransferEngine>>,
    log: Mutex<Vec<String>>,
    refuse_registrations: std::sync::atomic::AtomicBool,
}

impl Recorder {
    fn note(&self, what: String) {
        self.log.lock().unwrap().push(what);
    }

    fn taken(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }

    fn engine(&self) -> Arc<TransferEngine> {
        self.engine.get().and_then(Weak::upgrade).unwrap()
    }
}

impl Policy for Recorder {
    fn registered(&self, regions: &[Arc<Region>]) -> te_core::Result<()> {
        let r = &regions[0];
        self.note(format!("registered {:#x}+{}", r.addr(), r.len()));
        match self
            .refuse_registrations
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            true => Err(Error::InvalidArgument(
                "the policy refuses this memory".into(),
            )),
            false => Ok(()),
        }
    }

    fn unregistered(&self, regions: &[Arc<Region>]) {
        self.note(format!("unregistered {:#x}", regions[0].addr()));
    }

    fn allocate(&self, capacity: usize) -> te_core::Result<BatchId> {
        self.note(format!("allocate {capacity}"));
        self.engine().allocate_watched_batch(capacity, None)
    }

    fn submit(
        &self,
        batch: BatchId,
        requests: &[TransferRequest],
        options: &SubmitOptions,
    ) -> te_core::Result<()> {
        self.note(format!(
            "submit {} within {:?} notify {}",
            requests.len(),
            options.timeout,
            options.notify.is_some()
        ));
        let mine = options.clone().via("mover").as_planned();
        self.engine().submit_with(batch, requests, &mine)
    }

    fn freed(&self, batch: BatchId) {
        self.note(format!("freed {}", batch.raw() != 0));
    }
}

struct Rig {
    engine: Arc<TransferEngine>,
    mover: Arc<SimTransport>,
    local: Arc<HostBuffer>,
    remote: Arc<HostBuffer>,
    segment: u64,
}

fn rig() -> Rig {
    let mut config = Config::from_lookup(|_| None).unwrap();
    config.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    let engine = Arc::new(TransferEngine::init(config, "P2PHANDSHAKE", "127.0.0.1").unwrap());
    // The engine's own choice would be `sim` (installed first); the policy picks `mover`.
    let sim = Arc::new(SimTransport::named("sim", Capabilities::DRAM_REMOTE_HOST));
    let mover = Arc::new(SimTransport::named("mover", Capabilities::DRAM_REMOTE_HOST));
    engine.install_transport(sim).unwrap();
    engine.install_transport(mover.clone()).unwrap();
    let (local, remote, segment) = te_testkit::own_buffers(&engine, LEN as usize);
    local
        .write_at(0, &te_testkit::pattern(3, LEN as usize))
        .unwrap();
    Rig {
        engine,
        mover,
        local,
        remote,
        segment,
    }
}

impl Rig {
    fn write(&self) -> TransferRequest {
        TransferRequest {
            opcode: Opcode::Write,
            source: self.local.addr(),
            target_id: self.segment,
            target_offset: self.remote.addr(),
            length: LEN,
        }
    }

    /// Carries out every slice `mover` holds (a copy within this process); how many.
    fn move_all(&self) -> usize {
        self.mover.carry_writes(&self.local, &self.remote)
    }
}

fn installed(r: &Rig) -> Arc<Recorder> {
    let policy = Arc::new(Recorder::default());
    policy.engine.set(Arc::downgrade(&r.engine)).unwrap();
    let weak: Weak<dyn Policy> = Arc::downgrade(&policy) as _;
    r.engine.install_policy(weak).unwrap();
    policy
}

#[test]
fn batches_and_submits_through_the_engine_are_the_policys() {
    let r = rig();
    let policy = installed(&r);
    let b = r.engine.allocate_batch(2).unwrap();
    let note = Notification {
        name: "policy".into(),
        notify_msg: "planned and done".into(),
    };
    let options =
        (SubmitOptions::default().within(Duration::from_secs(30))).notifying(note.clone());
    // A notification with no request is refused before the policy is asked.
    assert!(matches!(
        r.engine.submit_with(b, &[], &options),
        Err(Error::InvalidArgument(_))
    ));
    r.engine.submit_with(b, &[r.write()], &options).unwrap();
    assert!(r.move_all() > 0, "the policy posted through mover");
    let s = r.engine.wait(b, Duration::from_secs(10)).unwrap();
    assert_eq!(s.state, TransferState::Completed);
    te_testkit::assert_same_bytes(
        &r.remote.to_vec(0, LEN as usize).unwrap(),
        &r.local.to_vec(0, LEN as usize).unwrap(),
        "the policy's post",
    );
    let got = r
        .engine
        .next_notify(Duration::from_secs(10))
        .expect("notified");
    assert_eq!(got.notification, note);
    r.engine.free_batch(b).unwrap();
    assert_eq!(
        policy.taken(),
        [
            "allocate 2",
            "submit 1 within Some(30s) notify true",
            "freed true"
        ]
    );
    // A second policy is refused; the first stays.
    let other: Weak<dyn Policy> = Arc::downgrade(&Arc::new(Recorder::default())) as _;
    assert!(matches!(
        r.engine.install_policy(other),
        Err(Error::InvalidArgument(_))
    ));
    let b = r.engine.allocate_batch(1).unwrap();
    assert_eq!(policy.taken(), ["allocate 1"]);
    r.engine.free_batch(b).unwrap();
}

#[test]
fn a_registration_the_policy_refuses_is_undone() {
    let r = rig();
    let policy = installed(&r);
    let buf = Arc::new(HostBuffer::new(4096).unwrap());
    r.engine
        .register_buffer(&buf, "*", Permission::LocalOnly)
        .unwrap();
    r.engine.unregister_memory(buf.addr()).unwrap();
    let at = buf.addr();
    assert_eq!(
        policy.taken(),
        [
            format!("registered {at:#x}+4096"),
            format!("unregistered {at:#x}")
        ]
    );
    policy
        .refuse_registrations
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let refused = r.engine.register_buffer(&buf, "*", Permission::LocalOnly);
    assert!(
        matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("refuses")),
        "{refused:?}"
    );
    assert!(matches!(
        r.engine.pin_local(at, 4096),
        Err(Error::AddressNotRegistered { .. })
    ));
}

#[test]
fn once_the_policy_is_gone_the_engine_plans_alone() {
    let r = rig();
    let policy = installed(&r);
    drop(policy);
    let b = r.engine.allocate_batch(1).unwrap();
    r.engine.submit(b, &[r.write()]).unwrap();
    // The engine's own choice is `sim`: nothing reaches `mover`.
    assert_eq!(r.move_all(), 0);
    r.engine.cancel(b).unwrap();
}
