//! Following the head key through an etcd watch, so that [`crate::EtcdLog::head`] and
//! [`vmplane_store::EventLog::wait_for`] (and with them every subscription) see commits made by
//! other servers, and the committer learns early that its caches went stale.
//!
//! The watch starts at the revision the head was read at, plus one. When its stream breaks (the
//! member died, lost its leader or restarted) it resumes from the last revision seen plus one; if
//! that revision was compacted away it reads the head again and watches from that read's
//! revision. Only the head key's latest value matters, so nothing can be missed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::WatchOptions;

use crate::Shared;
use crate::etcd::Etcd;
use crate::keys::Head;

/// Pause before re-creating a broken watch.
const REWATCH_PAUSE_MS: u64 = 200;

pub(crate) async fn follow_head(etcd: Etcd, key: Vec<u8>, from_revision: i64, shared: Arc<Shared>) {
    let mut next_revision = from_revision;
    loop {
        let options = WatchOptions::new().with_start_revision(next_revision);
        let mut client = etcd.client();
        // A member that is restarting accepts the connection before it serves: bound the wait.
        let created = tokio::time::timeout(
            etcd.request_timeout(),
            client.watch(key.clone(), Some(options)),
        )
        .await;
        if let Ok(Ok(mut stream)) = created {
            while let Ok(Some(response)) = stream.message().await {
                if response.canceled() {
                    if response.compact_revision() > 0 {
                        next_revision = reread(&etcd, &key, &shared).await;
                    }
                    break;
                }
                for event in response.events() {
                    if let Some(kv) = event.kv() {
                        next_revision = next_revision.max(kv.mod_revision() + 1);
                        if let Ok(head) = Head::decode(kv.value()) {
                            shared.publish(head.position);
                        }
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(REWATCH_PAUSE_MS)).await;
    }
}

/// Reads the head again after a compaction; returns the revision to watch from.
async fn reread(etcd: &Etcd, key: &[u8], shared: &Shared) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    let response = etcd
        .retry("re-reading the head", deadline, |mut kv| {
            let key = key.to_vec();
            async move { kv.get(key, None).await }
        })
        .await;
    match response {
        Ok(response) => {
            if let Some(kv) = response.kvs().first()
                && let Ok(head) = Head::decode(kv.value())
            {
                shared.publish(head.position);
            }
            response.header().map_or(0, |h| h.revision()) + 1
        }
        // Watching from 0 means "from now": the next head change is still seen.
        Err(_) => 0,
    }
}
