//! `dispatch_due` on `MemoryStore`: every re-published task comes with its
//! stamp, the task's id and assignment version as the round read it.

use std::time::Duration;

use taskfence::clock::ManualClock;
use taskfence::dispatch::dispatch_due;
use taskfence::wire::Stamp;
use taskfence::{Claim, ClaimRequest, InputHash, MemoryStore, NewTask, RequestKey, TaskStore};

fn new_task(key: &str) -> NewTask {
    NewTask::new(RequestKey::new("user-1", "chat.reply", key), InputHash::of([key]))
}

#[tokio::test]
async fn due_tasks_are_published_with_their_id_and_version() {
    let clock = ManualClock::default();
    let store = MemoryStore::with_clock(clock.clone());
    let a = store.submit(new_task("a")).await.unwrap().into_task().id;
    let b = store.submit(new_task("b")).await.unwrap().into_task().id;
    let claim = |id| store.claim(id, ClaimRequest::new("w", Duration::from_secs(30)));
    // `a` is claimed twice (a takeover after its first lease ran out), `b` once.
    assert!(matches!(claim(a).await.unwrap(), Claim::Acquired(_)));
    clock.advance(Duration::from_secs(31));
    assert!(matches!(claim(a).await.unwrap(), Claim::Acquired(_)));
    assert!(matches!(claim(b).await.unwrap(), Claim::Acquired(_)));
    clock.advance(Duration::from_secs(31));

    let mut sent = Vec::new();
    let round = dispatch_due(&store, 10, |stamp: Stamp| {
        sent.push(stamp);
        std::future::ready(Ok::<(), std::io::Error>(()))
    })
    .await
    .unwrap();
    let mut published = round.published.clone();
    published.sort();
    let mut both = vec![a, b];
    both.sort();
    assert_eq!(published, both);
    sent.sort_by_key(|stamp| stamp.task_id);
    let mut expected = vec![Stamp::new(a, 2), Stamp::new(b, 1)];
    expected.sort_by_key(|stamp| stamp.task_id);
    assert_eq!(sent, expected, "each task's id and its version as read");
    for stamp in &sent {
        let task = store.get(stamp.task_id).await.unwrap().unwrap();
        assert_eq!(*stamp, Stamp::from(&task));
    }
    // The claim the message leads to gets a higher version.
    let Claim::Acquired(lease) = claim(b).await.unwrap() else {
        panic!("expired: taken over")
    };
    assert!(lease.version() > expected.iter().find(|s| s.task_id == b).unwrap().version);
}
