//! A scratch etcd restored from a snapshot, for `backups verify --deep`:
//! `etcdctl snapshot restore` into a temporary data dir, `etcd` started on
//! loopback ports, every key counted, everything removed again. Needs the
//! `etcd` and `etcdctl` binaries (Debian: `etcd-server`, `etcd-client`); when
//! they are absent the deep check says so instead of pretending.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The binaries a scratch restore needs, and how a stream replay applies
/// its revisions (`stream::replay`).
pub struct ScratchTools {
    pub etcd: PathBuf,
    pub etcdctl: PathBuf,
    /// Replay through a scratch etcd's API instead of writing the base's
    /// database directly (`HCP_DR_REPLAY_THROUGH_ETCD=1`; tests set it).
    pub replay_through_etcd: bool,
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port: {e}"))
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl ScratchTools {
    /// `etcd` and `etcdctl` from `PATH`, or why not, ending in what needed
    /// them (`purpose`: "the deep check did not run", "a replay runs one").
    pub fn find_for(purpose: &str) -> Result<ScratchTools, String> {
        match (which("etcd"), which("etcdctl")) {
            (Some(etcd), Some(etcdctl)) => Ok(ScratchTools {
                etcd,
                etcdctl,
                replay_through_etcd: std::env::var("HCP_DR_REPLAY_THROUGH_ETCD").is_ok_and(|v| v == "1" || v == "true"),
            }),
            _ => Err(format!("no etcd/etcdctl binaries in PATH (apt-get install etcd-server etcd-client): {purpose}")),
        }
    }

    /// Restore the plaintext snapshot file `snapshot` into a scratch member
    /// and count its keys.
    pub async fn count_keys_of(&self, snapshot: &Path) -> Result<u64, String> {
        let dir = scratch_dir()?;
        self.count_keys_in(snapshot, &dir.0).await
    }

    async fn count_keys_in(&self, snapshot: &Path, dir: &Path) -> Result<u64, String> {
        let mut etcd = self.start_restored(snapshot, dir, &[]).await?;
        let attempt = async {
            let mut client = etcd_client::Client::connect([etcd.client_url.as_str()], None).await?;
            let resp = client
                .get("", Some(etcd_client::GetOptions::new().with_all_keys().with_count_only()))
                .await?;
            Ok::<u64, etcd_client::Error>(resp.count() as u64)
        };
        let count = tokio::time::timeout(Duration::from_secs(60), attempt)
            .await
            .map_err(|_| "counting the scratch etcd's keys took more than 60s".to_string())?
            .map_err(|e| format!("counting the scratch etcd's keys: {e}"));
        etcd.stop().await;
        count
    }

    /// Restore the plaintext snapshot file `snapshot` into `dir/data` and
    /// start a one-member etcd on it on loopback ports, with `extra` flags;
    /// returns once it answers (at most 60s). It is killed on drop.
    pub async fn start_restored(&self, snapshot: &Path, dir: &Path, extra: &[&str]) -> Result<ScratchEtcd, String> {
        let (peer, client_port) = (free_port()?, free_port()?);
        let data = dir.join("data");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let client_url = format!("http://127.0.0.1:{client_port}");
        let restore = tokio::process::Command::new(&self.etcdctl)
            .env("ETCDCTL_API", "3")
            .arg("snapshot")
            .arg("restore")
            .arg(snapshot)
            .arg("--data-dir")
            .arg(&data)
            .args(["--name", "scratch", "--initial-cluster", &format!("scratch={peer_url}")])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .output()
            .await
            .map_err(|e| format!("running {}: {e}", self.etcdctl.display()))?;
        if !restore.status.success() {
            return Err(format!("etcdctl snapshot restore failed: {}", String::from_utf8_lossy(&restore.stderr).trim()));
        }
        let child = tokio::process::Command::new(&self.etcd)
            .arg("--data-dir")
            .arg(&data)
            .args(["--name", "scratch", "--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--initial-cluster", &format!("scratch={peer_url}")])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.etcd.display()))?;
        let mut etcd = ScratchEtcd { child, client_url };
        let started = Instant::now();
        loop {
            let attempt = async {
                let mut client = etcd_client::Client::connect([etcd.client_url.as_str()], None).await?;
                client.status().await
            };
            match tokio::time::timeout(Duration::from_secs(5), attempt).await {
                Ok(Ok(_)) => return Ok(etcd),
                _ if started.elapsed() > Duration::from_secs(60) => {
                    etcd.stop().await;
                    return Err("the scratch etcd did not answer within 60s".into());
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}

/// A one-member etcd on loopback restored from a snapshot
/// ([`ScratchTools::start_restored`]); killed when dropped.
pub struct ScratchEtcd {
    child: tokio::process::Child,
    /// `http://127.0.0.1:<port>`.
    pub client_url: String,
}

impl ScratchEtcd {
    /// Kill it and wait until it is gone.
    pub async fn stop(&mut self) {
        let _ = self.child.kill().await;
        let _ = self.child.wait().await;
    }
}

/// A new private (0700) scratch directory under TMPDIR, removed on drop.
fn scratch_dir() -> Result<TempDir, String> {
    let dir = TempDir(std::env::temp_dir().join(format!("hcp-dr-scratch-{}-{}", std::process::id(), crate::archive::new_backup_id(chrono::Utc::now()))));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir.0)
        .map_err(|e| format!("{}: {e}", dir.0.display()))?;
    Ok(dir)
}
