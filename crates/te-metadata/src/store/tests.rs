use super::*;
use log::{MIN_COMPACT, log_path};
use std::fs::File;
use std::path::Path;

/// A snapshot path of test `name`'s own; its files are removed when it is dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        for p in [
            self.0.clone(),
            log_path(&self.0),
            self.0.with_extension("tmp"),
        ] {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn fresh(name: &str) -> Scratch {
    let path = std::env::temp_dir().join(format!(
        "te-metadata-store-{name}-{}.json",
        std::process::id()
    ));
    let scratch = Scratch(path);
    drop(Scratch(scratch.0.clone()));
    scratch
}

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

fn keys(store: &Store) -> BTreeMap<String, String> {
    store.keys().map.clone()
}

#[test]
fn changes_survive_a_restart_and_each_costs_its_own_size() {
    let scratch = fresh("restart");
    let path = scratch.0.clone();
    let store = Store::load(Some(path.clone()), usize::MAX).unwrap();
    store.put("big", &"b".repeat(100 << 10)).unwrap();
    store.put("a", "1").unwrap();
    let before = len(&log_path(&path));
    store.put("mooncake/ram/n", "desc").unwrap();
    let line = br#"["put","mooncake/ram/n","desc"]"#.len() as u64 + 1;
    assert_eq!(
        len(&log_path(&path)),
        before + line,
        "one line, not the store"
    );
    assert!(store.delete("a").unwrap());
    assert!(!store.delete("a").unwrap(), "gone already");
    assert!(!path.exists(), "no snapshot until the log outgrows it");
    let want = keys(&store);
    drop(store);
    let again = Store::load(Some(path.clone()), usize::MAX).unwrap();
    assert_eq!(keys(&again), want);
    assert_eq!(again.get("mooncake/ram/n").as_deref(), Some("desc"));
    assert_eq!(again.get("a"), None);
}

#[test]
fn a_value_already_held_and_a_key_not_there_write_nothing() {
    let scratch = fresh("unchanged");
    let path = scratch.0.clone();
    let store = Store::load(Some(path.clone()), usize::MAX).unwrap();
    store.put("k", "v").unwrap();
    let logged = len(&log_path(&path));
    store.put("k", "v").unwrap();
    assert!(!store.delete("missing").unwrap());
    assert_eq!(len(&log_path(&path)), logged);
    store.put("k", "w").unwrap();
    assert!(len(&log_path(&path)) > logged, "a new value is logged");
}

#[test]
fn a_torn_last_line_is_dropped_and_any_other_bad_line_stops_the_start() {
    let scratch = fresh("torn");
    let path = scratch.0.clone();
    let good = b"[\"put\",\"a\",\"1\"]\n[\"del\",\"zz\"]\n";
    let mut bytes = good.to_vec();
    bytes.extend_from_slice(br#"["put","b","cut sh"#);
    std::fs::write(log_path(&path), &bytes).unwrap();
    let store = Store::load(Some(path.clone()), usize::MAX).unwrap();
    assert_eq!(store.get("a").as_deref(), Some("1"));
    assert_eq!(store.get("b"), None, "never acknowledged");
    assert_eq!(
        len(&log_path(&path)),
        good.len() as u64,
        "the torn tail is cut"
    );
    store.put("c", "3").unwrap();
    drop(store);
    let again = Store::load(Some(path.clone()), usize::MAX).unwrap();
    assert_eq!(
        again.get("c").as_deref(),
        Some("3"),
        "the next change is a line of its own"
    );
    drop(again);

    for bad in [
        &b"garbage\n[\"put\",\"a\",\"1\"]\n"[..],
        b"[\"put\",\"a\"]\n",
        b"[\"move\",\"a\",\"b\"]\n",
        b"[\"put\",\"a\",1]\n",
    ] {
        std::fs::write(log_path(&path), bad).unwrap();
        let err = Store::load(Some(path.clone()), usize::MAX)
            .err()
            .expect("a bad line refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("line 1"), "{err}");
    }
}

#[test]
fn the_log_is_folded_into_the_snapshot_once_it_outgrows_it() {
    let scratch = fresh("compact");
    let path = scratch.0.clone();
    let store = Store::load(Some(path.clone()), usize::MAX).unwrap();
    let value = |i: usize| format!("{i}{}", "v".repeat(64 << 10));
    // Twenty 64 KiB changes to one key: past 1 MiB of log, with a snapshot far smaller.
    for i in 0..20 {
        store.put("k", &value(i)).unwrap();
    }
    store.put("other", "o").unwrap();
    assert!(path.exists(), "compacted into a snapshot");
    assert!(
        len(&log_path(&path)) < MIN_COMPACT,
        "the log emptied at compaction: {} bytes",
        len(&log_path(&path))
    );
    drop(store);
    let again = Store::load(Some(path.clone()), usize::MAX).unwrap();
    assert_eq!(again.get("k"), Some(value(19)));
    assert_eq!(again.get("other").as_deref(), Some("o"));
}

#[test]
fn a_crash_between_the_snapshot_and_emptying_the_log_replays_to_the_same_keys() {
    let scratch = fresh("crash");
    let path = scratch.0.clone();
    let store = Store::load(Some(path.clone()), usize::MAX).unwrap();
    store.put("a", "1").unwrap();
    store.put("b", "2").unwrap();
    assert!(store.delete("a").unwrap());
    store.put("b", "3").unwrap();
    let logged = std::fs::read(log_path(&path)).unwrap();
    let want = keys(&store);
    store.writer().log.as_mut().unwrap().compact(&want).unwrap();
    drop(store);
    // The snapshot was renamed in, but the log was never emptied.
    std::fs::write(log_path(&path), &logged).unwrap();
    let again = Store::load(Some(path.clone()), usize::MAX).unwrap();
    assert_eq!(keys(&again), want);
    assert_eq!(again.get("b").as_deref(), Some("3"));
    assert_eq!(again.get("a"), None);
}

#[test]
fn a_change_that_cannot_be_logged_is_not_applied() {
    let scratch = fresh("failing");
    let path = scratch.0.clone();
    let store = Store::load(Some(path.clone()), usize::MAX).unwrap();
    store.put("k", "old").unwrap();
    // The log's handle swapped for a read-only one: every write fails, and so does undoing it.
    store.writer().log.as_mut().unwrap().file = File::open(log_path(&path)).unwrap();
    assert!(store.put("k", "new").is_err());
    assert_eq!(store.get("k").as_deref(), Some("old"), "memory unchanged");
    assert!(store.delete("k").is_err());
    assert_eq!(store.get("k").as_deref(), Some("old"));
    let err = store.put("j", "x").unwrap_err();
    assert!(err.to_string().contains("restart the server"), "{err}");
    drop(store);
    let again = Store::load(Some(path.clone()), usize::MAX).unwrap();
    assert_eq!(again.get("k").as_deref(), Some("old"));
    assert_eq!(again.get("j"), None);
}

#[test]
fn a_snapshot_from_before_the_log_still_loads() {
    let scratch = fresh("old");
    let path = scratch.0.clone();
    std::fs::write(&path, br#"{"mooncake/ram/a":"{\"name\":\"a\"}"}"#).unwrap();
    let store = Store::load(Some(path.clone()), usize::MAX).unwrap();
    assert_eq!(
        store.get("mooncake/ram/a").as_deref(),
        Some(r#"{"name":"a"}"#)
    );
    std::fs::write(&path, b"{ not json").unwrap();
    drop(store);
    let err = Store::load(Some(path), usize::MAX)
        .err()
        .expect("a corrupt snapshot refused");
    assert!(err.to_string().contains("not a JSON object"), "{err}");
}

#[test]
fn readers_do_not_wait_for_a_change_being_written() {
    let scratch = fresh("readers");
    let store = Store::load(Some(scratch.0.clone()), usize::MAX).unwrap();
    store.put("k", "v").unwrap();
    // A writer holding its lock (a change on its way to the disk) leaves readers be.
    let writing = store.writer();
    assert_eq!(store.get("k").as_deref(), Some("v"));
    drop(writing);
}

#[test]
fn the_store_takes_no_more_than_its_limit_and_a_restart_keeps_what_it_took() {
    let scratch = fresh("limit");
    let path = scratch.0.clone();
    let each = cost("k1", &"v".repeat(100));
    let store = Store::load(Some(path.clone()), 2 * each + 10).unwrap();
    store.put("k1", &"v".repeat(100)).unwrap();
    store.put("k2", &"v".repeat(100)).unwrap();
    assert_eq!(store.bytes(), 2 * each);
    let logged = len(&log_path(&path));
    let err = store.put("k3", &"v".repeat(100)).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::StorageFull);
    assert!(err.to_string().contains("--max-stored"), "{err}");
    assert_eq!(store.get("k3"), None, "nothing stored");
    assert_eq!(len(&log_path(&path)), logged, "nothing logged");
    // Growing a value past the limit is refused; keeping or shrinking it is taken.
    let err = store.put("k1", &"v".repeat(111)).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::StorageFull);
    assert_eq!(store.get("k1").as_deref(), Some(&*"v".repeat(100)));
    store.put("k1", &"w".repeat(100)).unwrap();
    store.put("k1", "short").unwrap();
    assert_eq!(store.bytes(), each + cost("k1", "short"));
    // A DELETE gives the room back.
    assert!(store.delete("k2").unwrap());
    store.put("k3", &"v".repeat(100)).unwrap();
    assert_eq!(store.bytes(), cost("k1", "short") + each);
    drop(store);
    // Read back under a smaller limit, every acknowledged key stays; only shrinking is taken.
    let again = Store::load(Some(path), each).unwrap();
    assert_eq!(again.get("k1").as_deref(), Some("short"));
    assert_eq!(again.get("k3").as_deref(), Some(&*"v".repeat(100)));
    assert_eq!(
        again.put("k4", "").unwrap_err().kind(),
        io::ErrorKind::StorageFull
    );
    assert!(again.delete("k1").unwrap());
    again.put("k3", "v").unwrap();
    again.put("k4", "").unwrap();
}

#[test]
fn an_empty_value_still_costs_its_key() {
    let store = Store::load(None, 10 * ENTRY_COST).unwrap();
    let mut taken = 0;
    while store.put(&format!("{taken}"), "").is_ok() {
        taken += 1;
    }
    assert!((9..=10).contains(&taken), "{taken} empty values taken");
    assert!(store.bytes() <= 10 * ENTRY_COST);
}

fn waiting(s: io::Result<Submitted>) -> Ticket {
    match s.unwrap() {
        Submitted::Waiting(t) => t,
        other => panic!("expected a change waiting for its sync, got {other:?}"),
    }
}

#[test]
fn changes_wait_for_their_sync_and_one_sync_settles_them_in_order() {
    let scratch = fresh("group");
    let path = scratch.0.clone();
    let store = Store::load(Some(path.clone()), usize::MAX).unwrap();
    store.put("a", "0").unwrap();
    let a1 = waiting(store.submit("a", Some("1")));
    let b = waiting(store.submit("b", Some("x")));
    let a2 = waiting(store.submit("a", Some("2")));
    // Checked against the changes waiting, not only the map: the value about to be held
    // writes nothing, and a key about to be there can be deleted.
    let logged = len(&log_path(&path));
    assert!(matches!(
        store.submit("a", Some("2")).unwrap(),
        Submitted::Done
    ));
    assert_eq!(len(&log_path(&path)), logged, "nothing written");
    let del_b = waiting(store.submit("b", None));
    assert!(matches!(
        store.submit("b", None).unwrap(),
        Submitted::Absent
    ));
    // Nothing is visible or answered before the sync.
    assert_eq!(store.get("a").as_deref(), Some("0"));
    assert_eq!(store.get("b"), None);
    assert!([&a1, &b, &a2, &del_b].iter().all(|t| t.outcome().is_none()));
    store.settle();
    assert!(
        [&a1, &b, &a2, &del_b]
            .iter()
            .all(|t| t.outcome() == Some(&Ok(())))
    );
    assert_eq!(store.get("a").as_deref(), Some("2"), "applied in order");
    assert_eq!(store.get("b"), None);
    store.settle();
    let want = keys(&store);
    drop(store);
    let again = Store::load(Some(path), usize::MAX).unwrap();
    assert_eq!(keys(&again), want);
}

#[test]
fn a_failed_sync_refuses_every_change_it_covered_and_changes_nothing() {
    let scratch = fresh("failsync");
    let path = scratch.0.clone();
    let store = Store::load(Some(path.clone()), 10_000).unwrap();
    store.put("kept", "1").unwrap();
    let logged = len(&log_path(&path));
    let lost = [
        waiting(store.submit("kept", Some("2"))),
        waiting(store.submit("new", Some(&"n".repeat(5_000)))),
    ];
    store.writer().log.as_mut().unwrap().fail_next_sync = true;
    store.settle();
    for t in &lost {
        let why = t.outcome().unwrap().as_ref().unwrap_err();
        assert!(why.contains("injected sync failure"), "{why}");
    }
    assert_eq!(store.get("kept").as_deref(), Some("1"));
    assert_eq!(store.get("new"), None);
    assert_eq!(len(&log_path(&path)), logged, "cut off the log");
    // The room the refused changes would have taken is free again, and the log takes changes.
    store.put("other", &"o".repeat(5_000)).unwrap();
    drop(store);
    let again = Store::load(Some(path), 10_000).unwrap();
    assert_eq!(again.get("kept").as_deref(), Some("1"));
    assert_eq!(again.get("new"), None);
    assert_eq!(again.get("other").map(|v| v.len()), Some(5_000));
}

#[test]
fn the_limit_counts_the_changes_waiting_for_their_sync() {
    let scratch = fresh("projected");
    let store = Store::load(Some(scratch.0.clone()), 2 * cost("k1", "vvvv")).unwrap();
    let first = waiting(store.submit("k1", Some("vvvv")));
    let second = waiting(store.submit("k2", Some("vvvv")));
    let err = store.submit("k3", Some("vvvv")).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::StorageFull);
    // A delete waiting makes room for what follows it.
    let gone = waiting(store.submit("k1", None));
    let third = waiting(store.submit("k3", Some("vvvv")));
    store.settle();
    assert!(
        [&first, &second, &gone, &third]
            .iter()
            .all(|t| t.outcome() == Some(&Ok(())))
    );
    assert_eq!(store.bytes(), 2 * cost("k1", "vvvv"));
}
