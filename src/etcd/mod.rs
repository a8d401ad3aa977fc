//! The etcd adapter: connect to one member with client TLS, read its status,
//! and stream a snapshot (Maintenance/Snapshot over gRPC) straight into a
//! store while hashing it, in constant memory.
//!
//! etcd ends every snapshot stream with the SHA-256 of the database bytes
//! before it; [`TrailingHash`] checks that on the fly, so a snapshot cut
//! short or corrupted in transit is caught before the backup is called good.

pub mod bbolt;
pub mod bolt;
pub mod latest_keys;
pub mod scratch;
pub mod verify;

use std::time::Duration;

use bytes::Bytes;
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::store::{Store, StoreError, hex};

/// Why talking to etcd failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The member could not be reached or refused the TLS handshake.
    #[error("connecting to etcd member {member} at {url}: {source}")]
    Connect {
        member: String,
        url: String,
        #[source]
        source: etcd_client::Error,
    },
    /// A request to the member failed.
    #[error("etcd member {member}: {action}: {source}")]
    Request {
        member: String,
        action: &'static str,
        #[source]
        source: etcd_client::Error,
    },
    /// Writing the snapshot to the store failed.
    #[error("etcd member {member}: storing the snapshot: {source}")]
    Store {
        member: String,
        #[source]
        source: StoreError,
    },
    /// The snapshot's trailing SHA-256 does not match its content.
    #[error("etcd member {member}: the snapshot is corrupt: etcd's trailing SHA-256 {expected} does not match the data ({actual}); {size} bytes received")]
    Integrity {
        member: String,
        expected: String,
        actual: String,
        size: u64,
    },
    /// The revision moved while the snapshot was taken: something still writes.
    #[error("etcd member {member}: revision moved from {before} to {after} during the snapshot: a writer is still running")]
    RevisionMoved { member: String, before: i64, after: i64 },
}

/// Client TLS for a member. The server certificate carries DNS names, not
/// pod IPs, so `server_name` is what the certificate is checked against.
#[derive(Clone)]
pub struct ClientTls {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub server_name: String,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// One member and how to reach it.
#[derive(Debug, Clone)]
pub struct Member {
    /// Pod name, e.g. `etcd-0`.
    pub name: String,
    /// `https://<pod IP>:2379` or a port-forwarded `https://127.0.0.1:<port>`.
    pub url: String,
    pub tls: Option<ClientTls>,
}

/// What a member says about itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemberStatus {
    /// The cluster this member belongs to (its response header's cluster ID).
    pub cluster_id: u64,
    pub member_id: u64,
    pub leader_id: u64,
    pub is_leader: bool,
    pub revision: i64,
    pub raft_term: u64,
    pub raft_index: u64,
    pub db_size: i64,
    pub db_size_in_use: i64,
    pub version: String,
    pub errors: Vec<String>,
}

/// An alarm raised in the cluster, on one member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberAlarm {
    pub member_id: u64,
    /// `NOSPACE` (the database hit its quota) or `CORRUPT` (a hash check failed).
    pub alarm: String,
}

/// One entry of the cluster's member list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ListedMember {
    pub id: u64,
    /// Empty while the member was added but never started.
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

/// What a snapshot produced.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct SnapshotReport {
    pub member: String,
    pub revision: i64,
    pub size: u64,
    /// SHA-256 of the whole stream as stored (database plus etcd's trailing hash).
    pub sha256: String,
    /// Size and SHA-256 of the stream as etcd sent it: the same as above
    /// unless the store transforms it (compression). Older journals lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<crate::store::PutReport>,
}

impl Member {
    /// Connect with short timeouts (a dead member must not hang a backup).
    pub async fn connect(&self) -> Result<Client, EtcdError> {
        self.connect_with(ConnectOptions::new()).await
    }

    /// As [`Member::connect`], for a watch that must end when the member
    /// loses its leader (a partitioned member would otherwise serve a
    /// watch that silently stops at its last revision).
    pub async fn connect_requiring_leader(&self) -> Result<Client, EtcdError> {
        self.connect_with(ConnectOptions::new().with_require_leader(true)).await
    }

    async fn connect_with(&self, options: ConnectOptions) -> Result<Client, EtcdError> {
        let mut options = options
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(30));
        if let Some(tls) = &self.tls {
            options = options.with_tls(
                TlsOptions::new()
                    .ca_certificate(Certificate::from_pem(tls.ca_pem.as_bytes()))
                    .identity(Identity::from_pem(tls.cert_pem.as_bytes(), tls.key_pem.as_bytes()))
                    .domain_name(tls.server_name.clone()),
            );
        }
        Client::connect([self.url.as_str()], Some(options))
            .await
            .map_err(|source| EtcdError::Connect {
                member: self.name.clone(),
                url: self.url.clone(),
                source,
            })
    }

    fn request(&self, action: &'static str) -> impl FnOnce(etcd_client::Error) -> EtcdError + '_ {
        move |source| EtcdError::Request {
            member: self.name.clone(),
            action,
            source,
        }
    }

    pub async fn status(&self, client: &mut Client) -> Result<MemberStatus, EtcdError> {
        let status = client.status().await.map_err(self.request("status"))?;
        let header = status.header();
        let member_id = header.map(|h| h.member_id()).unwrap_or_default();
        Ok(MemberStatus {
            cluster_id: header.map(|h| h.cluster_id()).unwrap_or_default(),
            member_id,
            leader_id: status.leader(),
            is_leader: member_id != 0 && member_id == status.leader(),
            revision: header.map(|h| h.revision()).unwrap_or_default(),
            raft_term: status.raft_term(),
            raft_index: status.raft_index(),
            db_size: status.db_size(),
            db_size_in_use: status.raft_used_db_size(),
            version: status.version().to_string(),
            errors: status.errors().to_vec(),
        })
    }

    /// A linearizable read through this member (what etcd's `/health` does):
    /// fails when the member cannot reach a quorum.
    pub async fn check_read(&self, client: &mut Client) -> Result<(), EtcdError> {
        client.get("health", None).await.map_err(self.request("linearizable read"))?;
        Ok(())
    }

    /// The alarms raised anywhere in the cluster (Maintenance/Alarm GET).
    pub async fn alarms(&self, client: &mut Client) -> Result<Vec<MemberAlarm>, EtcdError> {
        let response = client
            .alarm(etcd_client::AlarmAction::Get, etcd_client::AlarmType::None, None)
            .await
            .map_err(self.request("alarm list"))?;
        Ok(response
            .alarms()
            .iter()
            .filter(|a| a.alarm() != etcd_client::AlarmType::None)
            .map(|a| MemberAlarm {
                member_id: a.member_id(),
                alarm: a.alarm().as_str_name().to_string(),
            })
            .collect())
    }

    /// The cluster's member list, as this member knows it.
    pub async fn member_list(&self, client: &mut Client) -> Result<Vec<ListedMember>, EtcdError> {
        let response = client.member_list().await.map_err(self.request("member list"))?;
        Ok(response
            .members()
            .iter()
            .map(|m| ListedMember {
                id: m.id(),
                name: m.name().to_string(),
                peer_urls: m.peer_urls().to_vec(),
                client_urls: m.client_urls().to_vec(),
                is_learner: m.is_learner(),
            })
            .collect())
    }

    /// Write `value` at `key` through this member (one revision).
    pub async fn put(&self, client: &mut Client, key: &str, value: &str) -> Result<i64, EtcdError> {
        let response = client.put(key, value, None).await.map_err(self.request("put"))?;
        Ok(response.header().map(|h| h.revision()).unwrap_or_default())
    }

    /// The value at `key` as this member serves it to a linearizable read
    /// (`None`: no such key in the cluster this member belongs to).
    pub async fn get_value(&self, client: &mut Client, key: &str) -> Result<Option<Vec<u8>>, EtcdError> {
        let response = client.get(key, None).await.map_err(self.request("get"))?;
        Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// Delete `key` through this member.
    pub async fn delete(&self, client: &mut Client, key: &str) -> Result<(), EtcdError> {
        client.delete(key, None).await.map_err(self.request("delete"))?;
        Ok(())
    }

    /// Stream a snapshot of this member into `store` at `key`, checking etcd's
    /// trailing hash on the way and the revision it holds.
    pub async fn snapshot_to(&self, store: &dyn Store, key: &str) -> Result<SnapshotReport, EtcdError> {
        self.start_snapshot().await?.finish(store, key, &crate::meter::Meter::new()).await
    }

    /// Open a snapshot stream and wait for its first bytes. etcd serves a
    /// snapshot from one read transaction opened when the request arrives,
    /// so from here its content is fixed: writes that happen while the rest
    /// streams are not in it. The revision is read before the request and
    /// again once the stream has started; equal, they are the snapshot's.
    pub async fn start_snapshot(&self) -> Result<StartedSnapshot, EtcdError> {
        let mut started = self.open_snapshot().await?;
        let after = self.status(&mut started._client).await?.revision;
        if after != started.revision {
            return Err(EtcdError::RevisionMoved {
                member: self.name.clone(),
                before: started.revision,
                after,
            });
        }
        Ok(started)
    }

    /// Open a snapshot stream and wait for its first bytes, with the
    /// writers running: the content is fixed from here, but writes may have
    /// landed between the status read and the request, so the revision
    /// recorded is a lower bound (`hcp-dr stream` reads the exact one from
    /// the snapshot itself).
    pub async fn open_snapshot(&self) -> Result<StartedSnapshot, EtcdError> {
        let mut client = self.connect().await?;
        let before = self.status(&mut client).await?.revision;
        let mut stream = client
            .maintenance_client()
            .snapshot()
            .await
            .map_err(self.request("snapshot"))?;
        let (first, remaining) = match stream.message().await.map_err(self.request("snapshot"))? {
            Some(response) => (Bytes::copy_from_slice(response.blob()), response.remaining_bytes()),
            None => (Bytes::new(), 0),
        };
        Ok(StartedSnapshot {
            member: self.name.clone(),
            revision: before,
            size: first.len() as u64 + remaining,
            first,
            stream,
            _client: client,
        })
    }
}

/// The pieces a snapshot stream is gathered into (etcd sends 32 KiB at a
/// time): one hand-over between the tasks per piece, not per message.
const BATCH: usize = 1 << 20;

/// How many pieces may wait for the store, and for the hasher.
const IN_FLIGHT: usize = 4;

/// A snapshot whose content is fixed (etcd holds its read transaction) and
/// whose bytes are still to be received: [`StartedSnapshot::finish`] streams
/// them into a store. The writers may run again meanwhile.
pub struct StartedSnapshot {
    member: String,
    revision: i64,
    /// The stream's length, as etcd announced it with the first bytes.
    size: u64,
    first: Bytes,
    stream: etcd_client::SnapshotStreaming,
    _client: Client,
}

impl StartedSnapshot {
    /// The revision the snapshot holds.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    pub fn member(&self) -> &str {
        &self.member
    }

    /// The stream's length, as etcd announced it with the first bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Stream the rest into `store` at `key`, hashing it and checking etcd's
    /// trailing hash; a corrupt stream leaves nothing behind. The bytes
    /// received are counted in `meter`.
    pub async fn finish(self, store: &dyn Store, key: &str, meter: &crate::meter::Meter) -> Result<SnapshotReport, EtcdError> {
        let StartedSnapshot {
            member,
            revision,
            size,
            first,
            stream,
            _client,
        } = self;
        meter.expect(size);
        // Three parts run at once, so that the stream is drained about as
        // fast as etcd sends it: a receiver task takes the messages off the
        // connection and gathers them into pieces of BATCH bytes; a blocking
        // thread hashes each piece once, for etcd's trailing hash and for
        // the manifest's SHA-256 of the whole; the store writes them as they
        // are (`put_verbatim`: it need not hash them again). Pieces are
        // reference-counted, not copied between the three, and at most
        // 2 x IN_FLIGHT of them wait, so memory stays flat whatever the size.
        let (received, mut incoming) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(IN_FLIGHT);
        let (to_hash, mut hashing) = tokio::sync::mpsc::channel::<Bytes>(IN_FLIGHT);
        let meter = meter.clone();
        let receiver = tokio::spawn(async move {
            let mut stream = stream;
            let _client = _client;
            let mut piece = bytes::BytesMut::with_capacity(BATCH);
            piece.extend_from_slice(&first);
            loop {
                let (next, done) = match stream.message().await {
                    Ok(Some(response)) => {
                        piece.extend_from_slice(response.blob());
                        if piece.len() < BATCH {
                            continue;
                        }
                        (Ok(piece.split().freeze()), false)
                    }
                    Ok(None) => (Ok(piece.split().freeze()), true),
                    Err(err) => (Err(std::io::Error::other(err)), true),
                };
                if let Ok(bytes) = &next {
                    if bytes.is_empty() {
                        // the end, with nothing gathered since the last piece
                        return;
                    }
                    meter.add(bytes.len() as u64);
                    // the hasher only stops when this sender is gone
                    let _ = to_hash.send(bytes.clone()).await;
                }
                // the store gave up (its error is the one reported)
                if received.send(next).await.is_err() || done {
                    return;
                }
                piece.reserve(BATCH);
            }
        });
        let hasher = tokio::task::spawn_blocking(move || {
            let mut check = TrailingHash::default();
            while let Some(bytes) = hashing.blocking_recv() {
                check.update(&bytes);
            }
            check.finish_with_digest()
        });
        let chunks = futures::stream::poll_fn(move |cx| incoming.poll_recv(cx));
        let reader = tokio_util::io::StreamReader::new(Box::pin(chunks));
        let stored = store.put_verbatim(key, Box::new(reader)).await;
        // the body is dropped: the receiver stops if it has not, and the hasher gets its last piece
        receiver.abort();
        let stored = stored.map_err(|source| EtcdError::Store {
            member: member.clone(),
            source,
        })?;
        let (verdict, whole) = match hasher.await {
            Ok(hashed) => hashed,
            Err(err) => {
                let _ = store.delete(key).await;
                return Err(EtcdError::Store {
                    member,
                    source: crate::store::StoreError::Body {
                        key: key.to_string(),
                        source: std::io::Error::other(format!("hashing the snapshot stopped: {err}")),
                    },
                });
            }
        };
        let put = match stored {
            crate::store::Stored::Verbatim { size } if size == whole.size => whole.clone(),
            crate::store::Stored::Verbatim { size } => {
                let _ = store.delete(key).await;
                return Err(EtcdError::Store {
                    member,
                    source: crate::store::StoreError::Body {
                        key: key.to_string(),
                        source: std::io::Error::other(format!("the store wrote {size} bytes of the {} received", whole.size)),
                    },
                });
            }
            crate::store::Stored::Hashed(put) => put,
        };
        let (expected, actual) = match verdict {
            Verdict::Ok => {
                let raw = (put != whole).then_some(whole);
                return Ok(SnapshotReport {
                    member,
                    revision,
                    size: put.size,
                    sha256: put.sha256,
                    raw,
                });
            }
            Verdict::TooShort => ("(none)".to_string(), "(stream shorter than a hash)".to_string()),
            Verdict::Mismatch { expected, actual } => (expected, actual),
        };
        let _ = store.delete(key).await;
        Err(EtcdError::Integrity {
            member,
            expected,
            actual,
            size: put.size,
        })
    }
}

/// Checks that the last 32 bytes of a stream are the SHA-256 of the bytes
/// before them, holding back only those 32 bytes.
#[derive(Clone, Default)]
pub struct TrailingHash {
    sha: Sha256,
    tail: Vec<u8>,
    /// Bytes seen.
    size: u64,
}

/// The result of [`TrailingHash::finish`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    TooShort,
    Mismatch { expected: String, actual: String },
}

impl TrailingHash {
    pub fn update(&mut self, bytes: &[u8]) {
        self.size += bytes.len() as u64;
        // all but the last 32 bytes go straight to the hash
        if bytes.len() > 32 {
            let (head, last) = bytes.split_at(bytes.len() - 32);
            self.sha.update(&self.tail);
            self.sha.update(head);
            self.tail.clear();
            self.tail.extend_from_slice(last);
            return;
        }
        self.tail.extend_from_slice(bytes);
        if self.tail.len() > 32 {
            let spill = self.tail.len() - 32;
            self.sha.update(&self.tail[..spill]);
            self.tail.drain(..spill);
        }
    }

    /// The verdict, and the size and SHA-256 of the whole stream (the bytes
    /// before the trailing hash and the hash itself): one pass for both.
    pub fn finish_with_digest(self) -> (Verdict, crate::store::PutReport) {
        let mut whole = self.sha.clone();
        whole.update(&self.tail);
        let digest = crate::store::PutReport {
            size: self.size,
            sha256: hex(&whole.finalize()),
        };
        (self.finish(), digest)
    }

    pub fn finish(self) -> Verdict {
        if self.tail.len() < 32 {
            return Verdict::TooShort;
        }
        let actual = self.sha.finalize();
        if actual.as_slice() == self.tail.as_slice() {
            Verdict::Ok
        } else {
            Verdict::Mismatch {
                expected: hex(&self.tail),
                actual: hex(&actual),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_hash(data: &[u8]) -> Vec<u8> {
        let mut out = data.to_vec();
        out.extend_from_slice(&Sha256::digest(data));
        out
    }

    #[test]
    fn trailing_hash_accepts_any_chunking() {
        let stream = with_hash(&[5u8; 10_000]);
        for chunk in [1, 7, 31, 32, 33, 4096, 20_000] {
            let mut check = TrailingHash::default();
            for piece in stream.chunks(chunk) {
                check.update(piece);
            }
            assert_eq!(check.finish(), Verdict::Ok, "chunk {chunk}");
        }
    }

    #[test]
    fn one_pass_gives_the_trailing_verdict_and_the_whole_digest() {
        let stream = with_hash(&(0..100_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
        let whole = hex(&Sha256::digest(&stream));
        for chunk in [1, 31, 32, 33, 1000, 1 << 20] {
            let mut check = TrailingHash::default();
            for piece in stream.chunks(chunk) {
                check.update(piece);
            }
            let (verdict, digest) = check.finish_with_digest();
            assert_eq!(verdict, Verdict::Ok, "chunk {chunk}");
            assert_eq!((digest.size, digest.sha256.as_str()), (stream.len() as u64, whole.as_str()), "chunk {chunk}");
        }
    }

    #[test]
    fn trailing_hash_catches_flips_and_truncation() {
        let mut stream = with_hash(b"some database bytes");
        stream[3] ^= 1;
        let mut check = TrailingHash::default();
        check.update(&stream);
        assert!(matches!(check.finish(), Verdict::Mismatch { .. }));

        let stream = with_hash(b"some database bytes");
        let mut check = TrailingHash::default();
        check.update(&stream[..stream.len() - 5]);
        assert!(matches!(check.finish(), Verdict::Mismatch { .. }));

        let mut check = TrailingHash::default();
        check.update(b"short");
        assert_eq!(check.finish(), Verdict::TooShort);
    }
}
