//! Real etcd fixtures: plain member, HyperShift-shaped TLS cluster, snapshot restore.
//! Needs the `etcd` and `etcdctl` binaries (`apt-get install etcd-server etcd-client`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use hcp_dr_e2e::pki::{Ca, CertPair, client_tls_config};
use hcp_dr_e2e::procs::etcd::{
    ClientTls, ClusterState, EtcdMemberConfig, EtcdProcess, EtcdTls, RESTORE_BUMP_REVISION,
    client_cert_spec, connect_client, etcdctl_snapshot_restore, peer_cert_spec, restore_tool,
    server_cert_spec,
};
use hcp_dr_e2e::procs::{ProcError, alloc_loopback_ip, find_program};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NS: &str = "clusters-sandbox";
const HEALTHY: Duration = Duration::from_secs(60);

fn require_etcd() {
    find_program("etcd", "apt-get install etcd-server").unwrap_or_else(|e| panic!("{e}"));
    find_program("etcdctl", "apt-get install etcd-client").unwrap_or_else(|e| panic!("{e}"));
}

async fn tls_connect(
    config: Arc<rustls::ClientConfig>,
    addr: std::net::SocketAddr,
    name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let server_name =
        rustls::pki_types::ServerName::try_from(name.to_string()).map_err(std::io::Error::other)?;
    tokio_rustls::TlsConnector::from(config)
        .connect(server_name, tcp)
        .await
}

async fn get_value(endpoint: &str, tls: Option<&ClientTls>, key: &str) -> Option<Vec<u8>> {
    let mut client = connect_client(&[endpoint.to_string()], tls)
        .await
        .expect("connect");
    let resp = client.get(key, None).await.expect("get");
    resp.kvs().first().map(|kv| kv.value().to_vec())
}

async fn save_snapshot(endpoint: &str, tls: Option<&ClientTls>, path: &Path) -> i64 {
    let mut client = connect_client(&[endpoint.to_string()], tls)
        .await
        .expect("connect");
    let revision = client
        .status()
        .await
        .expect("status")
        .header()
        .expect("header")
        .revision();
    let mut stream = client.snapshot().await.expect("snapshot");
    let mut bytes = Vec::new();
    while let Some(msg) = stream.message().await.expect("snapshot chunk") {
        bytes.extend_from_slice(msg.blob());
    }
    assert!(!bytes.is_empty(), "empty snapshot");
    std::fs::write(path, bytes).expect("write snapshot");
    revision
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_member_serves_put_and_get() {
    require_etcd();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut etcd = EtcdProcess::start_plain(dir.path())
        .await
        .expect("start etcd");
    assert!(
        etcd.client_url().starts_with("http://127.0.0.1:"),
        "{}",
        etcd.client_url()
    );

    let mut client = connect_client(&[etcd.client_url()], None)
        .await
        .expect("connect");
    client.put("/registry/foo", "bar", None).await.expect("put");
    assert_eq!(
        get_value(&etcd.client_url(), None, "/registry/foo")
            .await
            .as_deref(),
        Some(&b"bar"[..])
    );
    assert!(etcd.config().log_path().exists());

    etcd.kill();
    assert!(!etcd.is_running());
}

/// One HyperShift-shaped member's certificates and config.
struct Member {
    cfg: EtcdMemberConfig,
    client_tls: ClientTls,
}

fn discovery_name(i: usize) -> String {
    format!("etcd-{i}.etcd-discovery.{NS}.svc")
}

/// Certificates as HyperShift issues them (see `server_cert_spec`), plus the
/// sandbox's IP-bearing peer certificates (see `peer_cert_spec`).
fn tls_members(ca: &Ca, root: &Path, count: usize) -> Vec<Member> {
    let tls_dir = root.join("tls");
    std::fs::create_dir_all(&tls_dir).expect("mkdir tls");
    let ca_file = tls_dir.join("ca.crt");
    std::fs::write(&ca_file, ca.cert_pem()).expect("write ca");
    let client = ca.issue(&client_cert_spec()).expect("client cert");
    let server = ca.issue(&server_cert_spec(NS)).expect("server cert");
    assert!(
        server_cert_spec(NS).ips.is_empty(),
        "serving certs carry no IP SANs"
    );
    let (server_cert_file, server_key_file) =
        server.write_files(&tls_dir, "server").expect("write");

    let ips: Vec<IpAddr> = (0..count)
        .map(|_| alloc_loopback_ip(&[2379, 2380]).expect("loopback ip"))
        .collect();
    let initial_cluster: Vec<(String, String)> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| (format!("etcd-{i}"), format!("https://{ip}:2380")))
        .collect();
    ips.iter()
        .enumerate()
        .map(|(i, ip)| {
            let peer = ca.issue(&peer_cert_spec(NS, *ip)).expect("peer cert");
            let (peer_cert_file, peer_key_file) = peer
                .write_files(&tls_dir, &format!("peer-{i}"))
                .expect("write");
            Member {
                cfg: EtcdMemberConfig {
                    name: format!("etcd-{i}"),
                    data_dir: root.join(format!("data-etcd-{i}")),
                    log_dir: root.join("logs"),
                    client_ip: *ip,
                    client_port: 2379,
                    peer_port: 2380,
                    initial_cluster: initial_cluster.clone(),
                    initial_cluster_state: ClusterState::New,
                    tls: Some(EtcdTls {
                        ca_file: ca_file.clone(),
                        server_cert_file: server_cert_file.clone(),
                        server_key_file: server_key_file.clone(),
                        peer_cert_file,
                        peer_key_file,
                        client_cert_auth: true,
                    }),
                    quota_backend_bytes: Some(8 * 1024 * 1024 * 1024),
                },
                client_tls: ClientTls {
                    ca_pem: ca.cert_pem().to_string(),
                    cert_pem: client.cert_pem.clone(),
                    key_pem: client.key_pem.clone(),
                    server_name: discovery_name(i),
                },
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_three_member_cluster_survives_losing_one_member() {
    require_etcd();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::new("etcd-signer").expect("ca");
    let members = tls_members(&ca, dir.path(), 3);
    let mut procs: Vec<EtcdProcess> = members
        .iter()
        .map(|m| EtcdProcess::start(m.cfg.clone()).expect("start member"))
        .collect();
    for (p, m) in procs.iter().zip(&members) {
        assert!(
            p.client_url().starts_with("https://127."),
            "{}",
            p.client_url()
        );
        p.wait_healthy(HEALTHY, Some(&m.client_tls))
            .await
            .expect("member healthy");
    }

    let url0 = procs[0].client_url();
    let mut c0 = connect_client(&[url0.as_str()], Some(&members[0].client_tls))
        .await
        .expect("connect");
    c0.put("/registry/ns/a", "1", None)
        .await
        .expect("put via member 0");
    let members_list = c0.member_list().await.expect("member list");
    assert_eq!(members_list.members().len(), 3);

    // The serving certificate has no IP SANs: verifying it against the IP fails.
    let addr = std::net::SocketAddr::new(members[0].cfg.client_ip, 2379);
    let client_pair = CertPair {
        cert_pem: members[0].client_tls.cert_pem.clone(),
        key_pem: members[0].client_tls.key_pem.clone(),
    };
    let with_cert = client_tls_config(ca.cert_pem(), Some(&client_pair)).expect("client cfg");
    let by_ip = tls_connect(
        with_cert.clone(),
        addr,
        &members[0].cfg.client_ip.to_string(),
    )
    .await;
    assert!(
        by_ip.is_err(),
        "the serving cert must not be valid for the pod IP"
    );
    tls_connect(with_cert, addr, &discovery_name(0))
        .await
        .expect("valid for the discovery name");

    // Client certificates are required.
    let anonymous = client_tls_config(ca.cert_pem(), None).expect("client cfg");
    match tls_connect(anonymous, addr, &discovery_name(0)).await {
        Err(_) => {}
        Ok(mut tls) => {
            // TLS 1.3 reports the missing certificate after the handshake.
            let _ = tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
            let mut buf = [0u8; 64];
            let read = tls.read(&mut buf).await;
            assert!(
                matches!(read, Err(_) | Ok(0)),
                "anonymous client was served: {read:?}"
            );
        }
    }

    procs[2].kill();
    assert!(!procs[2].is_running());
    // If member 2 led, the survivors elect a new leader first.
    for i in 0..2 {
        procs[i]
            .wait_healthy(HEALTHY, Some(&members[i].client_tls))
            .await
            .expect("survivor healthy");
    }
    for i in 0..2 {
        assert_eq!(
            get_value(
                &procs[i].client_url(),
                Some(&members[i].client_tls),
                "/registry/ns/a"
            )
            .await
            .as_deref(),
            Some(&b"1"[..])
        );
    }
    let mut c1 = connect_client(&[procs[1].client_url()], Some(&members[1].client_tls))
        .await
        .expect("connect");
    c1.put("/registry/ns/b", "2", None)
        .await
        .expect("put with 2 of 3 members");
    assert_eq!(
        get_value(
            &procs[0].client_url(),
            Some(&members[0].client_tls),
            "/registry/ns/b"
        )
        .await
        .as_deref(),
        Some(&b"2"[..])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshot_restores_into_a_new_member() {
    require_etcd();
    let dir = tempfile::tempdir().expect("tempdir");
    let source = EtcdProcess::start_plain(&dir.path().join("source"))
        .await
        .expect("source etcd");
    let mut client = connect_client(&[source.client_url()], None)
        .await
        .expect("connect");
    for i in 0..20 {
        client
            .put(format!("/registry/k{i}"), format!("v{i}"), None)
            .await
            .expect("put");
    }
    let snap = dir.path().join("snapshot.db");
    let revision = save_snapshot(&source.client_url(), None, &snap).await;
    assert!(revision >= 21, "revision {revision}");

    let ip = alloc_loopback_ip(&[2379, 2380]).expect("ip");
    let peer_url = format!("http://{ip}:2380");
    let initial = vec![("etcd-0".to_string(), peer_url.clone())];
    let data_dir: PathBuf = dir.path().join("restored/data");
    std::fs::create_dir_all(&data_dir).expect("mkdir (an empty dir is accepted)");
    etcdctl_snapshot_restore(&snap, &data_dir, "etcd-0", &initial, &peer_url).expect("restore");
    assert!(data_dir.join("member/snap/db").exists());

    // A non-empty target is refused: etcd would skip the snapshot.
    let err = etcdctl_snapshot_restore(&snap, &data_dir, "etcd-0", &initial, &peer_url)
        .expect_err("non-empty target");
    assert!(matches!(err, ProcError::InvalidConfig(_)), "{err}");

    let restored = EtcdProcess::start(EtcdMemberConfig {
        name: "etcd-0".into(),
        data_dir,
        log_dir: dir.path().join("restored"),
        client_ip: ip,
        client_port: 2379,
        peer_port: 2380,
        initial_cluster: initial,
        initial_cluster_state: ClusterState::New,
        tls: None,
        quota_backend_bytes: None,
    })
    .expect("start restored");
    restored
        .wait_healthy(HEALTHY, None)
        .await
        .expect("restored healthy");
    for i in [0, 7, 19] {
        assert_eq!(
            get_value(&restored.client_url(), None, &format!("/registry/k{i}")).await,
            Some(format!("v{i}").into_bytes())
        );
    }
    let mut rc = connect_client(&[restored.client_url()], None)
        .await
        .expect("connect");
    let restored_rev = rc
        .status()
        .await
        .expect("status")
        .header()
        .expect("header")
        .revision();
    if restore_tool().expect("restore tool").bump_revision {
        assert!(
            restored_rev >= revision + RESTORE_BUMP_REVISION as i64,
            "{restored_rev}"
        );
    } else {
        assert_eq!(restored_rev, revision);
    }
}

/// HyperShift's HA restore: every member restores the same snapshot with the
/// same `--initial-cluster`, then the three form one cluster holding the data.
#[tokio::test(flavor = "multi_thread")]
async fn three_members_restored_from_one_snapshot_form_a_cluster() {
    require_etcd();
    let dir = tempfile::tempdir().expect("tempdir");
    let source = EtcdProcess::start_plain(&dir.path().join("source"))
        .await
        .expect("source etcd");
    let mut client = connect_client(&[source.client_url()], None)
        .await
        .expect("connect");
    client
        .put("/registry/secrets/clusters-hc1/pull-secret", "s3cr3t", None)
        .await
        .expect("put");
    let snap = dir.path().join("snapshot.db");
    save_snapshot(&source.client_url(), None, &snap).await;

    let ips: Vec<IpAddr> = (0..3)
        .map(|_| alloc_loopback_ip(&[2379, 2380]).expect("ip"))
        .collect();
    let initial: Vec<(String, String)> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| (format!("etcd-{i}"), format!("http://{ip}:2380")))
        .collect();
    let mut members = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        let data_dir = dir.path().join(format!("data-etcd-{i}"));
        etcdctl_snapshot_restore(&snap, &data_dir, &initial[i].0, &initial, &initial[i].1)
            .expect("restore");
        members.push(
            EtcdProcess::start(EtcdMemberConfig {
                name: initial[i].0.clone(),
                data_dir,
                log_dir: dir.path().join("logs"),
                client_ip: *ip,
                client_port: 2379,
                peer_port: 2380,
                initial_cluster: initial.clone(),
                initial_cluster_state: ClusterState::New,
                tls: None,
                quota_backend_bytes: None,
            })
            .expect("start member"),
        );
    }
    for m in &members {
        m.wait_healthy(HEALTHY, None)
            .await
            .expect("restored member healthy");
    }
    let mut c = connect_client(&[members[1].client_url()], None)
        .await
        .expect("connect");
    let list = c.member_list().await.expect("member list");
    let mut names: Vec<&str> = list.members().iter().map(|m| m.name()).collect();
    names.sort();
    assert_eq!(names, ["etcd-0", "etcd-1", "etcd-2"]);
    for m in &members {
        assert_eq!(
            get_value(
                &m.client_url(),
                None,
                "/registry/secrets/clusters-hc1/pull-secret"
            )
            .await
            .as_deref(),
            Some(&b"s3cr3t"[..])
        );
    }
}
