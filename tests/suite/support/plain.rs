//! `hcp-dr stream` of a plain etcd, through the library: a source etcd on
//! loopback, a local store, and a stream of it while some work runs
//! (`stream.rs`, `stream_deep.rs`).

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use etcd_client::Client;
use hcp_dr::etcd::Member;
use hcp_dr::etcd::scratch::ScratchTools;
use hcp_dr::store::{LocalStore, Store};
use hcp_dr::stream::catalog;
use hcp_dr::stream::run::{Cluster, ClusterReport, StreamSettings, run};
use hcp_dr::stream::source::FixedMembers;
use hcp_dr::stream::writer::Cut;
use hcp_dr_e2e::procs::etcd::{EtcdProcess, connect_client};

/// The revision a response happened at.
pub fn revision_of(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.expect("a response header").revision()
}

/// Put `key`; its revision.
pub async fn put(client: &mut Client, key: &str, value: &str) -> i64 {
    revision_of(client.put(key, value, None).await.expect("put").header())
}

/// A plain etcd (`clusters/plain`) streamed to a local store in `dir`.
pub struct Plain {
    pub dir: tempfile::TempDir,
    pub source: EtcdProcess,
    pub client: Client,
    pub member: Member,
    pub store: Arc<dyn Store>,
    pub tools: ScratchTools,
}

impl Plain {
    pub async fn start() -> Plain {
        let tools = ScratchTools::find_for("the deep check did not run").unwrap_or_else(|e| panic!("{e}: install them with `apt-get install etcd-server etcd-client` (e2e/setup does)"));
        let dir = tempfile::tempdir().unwrap();
        let source = EtcdProcess::start_plain(&dir.path().join("source")).await.expect("etcd");
        let client = connect_client(&[source.client_url()], None).await.unwrap();
        let member = Member { name: "etcd-0".into(), url: source.client_url(), tls: None };
        let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path().join("store")));
        Plain { dir, source, client, member, store, tools }
    }

    pub fn settings(base_interval: Duration, encrypt_to: Option<&str>) -> StreamSettings {
        StreamSettings {
            cut: Cut { interval: Duration::from_millis(300), size: 1 << 20 },
            base_interval,
            level: 1,
            recipients: encrypt_to.map(|key| hcp_dr::archive::encryption::Recipients::parse(&[key.to_string()]).unwrap().unwrap()),
            watch: Default::default(),
            base_from_backup: false,
        }
    }

    /// Stream while `work` runs, then stop; the report.
    pub async fn stream_while(&self, settings: StreamSettings, work: impl std::future::Future<Output = ()>) -> ClusterReport {
        let cluster = Cluster { namespace: "clusters".into(), hosted_cluster: "plain".into(), store: self.store.clone(), source: Arc::new(FixedMembers(vec![self.member.clone()])) };
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let running = tokio::spawn(run(cluster, settings, stopped));
        let chains_before = self.chains().await.len();
        // a chain exists (resumed, or its base taken) before the work starts
        let mut client = self.client.clone();
        let marker = put(&mut client, "/stream-test/marker", &Utc::now().to_rfc3339()).await;
        for _ in 0..200 {
            if self.durable_through().await >= marker && self.chains().await.len() >= chains_before.max(1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(self.durable_through().await >= marker, "the stream never wrote revision {marker}");
        work.await;
        tokio::time::sleep(Duration::from_millis(800)).await;
        stop.send(true).unwrap();
        running.await.unwrap()
    }

    pub async fn chains(&self) -> Vec<catalog::ChainListing> {
        catalog::chains(self.store.as_ref(), "clusters", "plain").await.unwrap().0
    }

    /// The newest chain's last revision reached without a gap.
    pub async fn durable_through(&self) -> i64 {
        self.chains().await.last().and_then(|c| c.span()).map_or(0, |s| s.through)
    }
}
