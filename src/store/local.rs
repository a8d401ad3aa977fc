//! The local-directory store, hcp-dr's default. Backups hold secrets, so
//! folders are created 0700 and files 0600. A put writes `<key>.partial`,
//! fsyncs it and renames it into place, so a reader never sees half an object.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::io::AsyncWriteExt;

use super::{Body, Hasher, ObjectInfo, PutReport, Store, StoreError, check_key};

const CHUNK: usize = 1 << 20;
const PARTIAL: &str = ".partial";

#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl LocalStore {
    pub fn new(root: impl Into<PathBuf>) -> LocalStore {
        LocalStore { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> Result<PathBuf, StoreError> {
        check_key(key)?;
        Ok(self.root.join(key))
    }

    /// Write `body` to `key` through `key.partial`, fsync and rename, showing
    /// each piece written to `seen`; the bytes written.
    async fn write(&self, key: &str, mut body: Body<'_>, seen: &mut (dyn FnMut(&[u8]) + Send)) -> Result<u64, StoreError> {
        let path = self.path(key)?;
        if let Some(parent) = path.parent() {
            self.create_dirs(parent).await?;
        }
        let partial = PathBuf::from(format!("{}{PARTIAL}", path.display()));
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&partial)
            .await
            .map_err(io(&partial))?;
        let mut written = 0u64;
        let mut buf = vec![0u8; CHUNK];
        // a full disk is told as such, with what was written and what is free
        let full = |err: std::io::Error, written: u64| match crate::space::filled_up(
            &err,
            &partial,
            key,
            written,
            "free space there or back up to another store (--to); nothing was marked complete",
        ) {
            Some(no_space) => StoreError::NoSpace(no_space),
            None => io(&partial)(err),
        };
        let result: Result<(), StoreError> = async {
            loop {
                let n = super::read_full(&mut body, &mut buf)
                    .await
                    .map_err(|source| StoreError::Body {
                        key: key.to_string(),
                        source,
                    })?;
                if n == 0 {
                    break;
                }
                file.write_all(&buf[..n]).await.map_err(|e| full(e, written))?;
                written += n as u64;
                seen(&buf[..n]);
            }
            file.flush().await.map_err(|e| full(e, written))?;
            file.sync_all().await.map_err(|e| full(e, written))
        }
        .await;
        drop(file);
        if let Err(err) = result {
            let _ = tokio::fs::remove_file(&partial).await;
            return Err(err);
        }
        tokio::fs::rename(&partial, &path).await.map_err(io(&path))?;
        if let Some(parent) = path.parent() {
            // make the rename durable
            if let Ok(dir) = tokio::fs::File::open(parent).await {
                let _ = dir.sync_all().await;
            }
        }
        Ok(written)
    }

    /// Whether backups can be written here: the root is created (0700) if
    /// missing, and a probe file is written, fsynced and removed. Fails with
    /// the OS error of the step that failed (`/proc/nope`: `No such file or
    /// directory`; a read-only mount: `Read-only file system`). With
    /// `leave_nothing` (a dry run) the folders it created are removed again.
    pub async fn check_writable(&self, leave_nothing: bool) -> Result<(), StoreError> {
        let absolute = std::path::absolute(&self.root).unwrap_or(self.root.clone());
        let missing: Vec<PathBuf> = absolute.ancestors().take_while(|p| !p.exists()).map(Path::to_path_buf).collect();
        let created = self.create_dirs(&self.root).await;
        let probe = self.root.join(format!(".hcp-dr-write-probe-{}", std::process::id()));
        let written = match created {
            Ok(()) => async {
                let mut file = tokio::fs::OpenOptions::new().create(true).write(true).truncate(true).mode(0o600).open(&probe).await?;
                file.write_all(b"hcp-dr").await?;
                file.sync_all().await
            }
            .await
            .map_err(io(&probe)),
            Err(err) => Err(err),
        };
        let removed = match tokio::fs::remove_file(&probe).await {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(io(&probe)(err)),
            _ => Ok(()),
        };
        if leave_nothing {
            // deepest first; a folder something else wrote into stays
            for dir in &missing {
                let _ = tokio::fs::remove_dir(dir).await;
            }
        }
        written.and(removed)
    }

    async fn create_dirs(&self, dir: &Path) -> Result<(), StoreError> {
        let mut builder = tokio::fs::DirBuilder::new();
        builder.recursive(true).mode(0o700);
        builder.create(dir).await.map_err(io(dir))
    }
}

#[async_trait]
impl Store for LocalStore {
    fn local_dir(&self) -> Option<&Path> {
        Some(&self.root)
    }

    fn url(&self) -> String {
        format!("file://{}", std::path::absolute(&self.root).unwrap_or(self.root.clone()).display())
    }

    async fn put(&self, key: &str, body: Body<'_>) -> Result<PutReport, StoreError> {
        let mut hasher = Hasher::default();
        self.write(key, body, &mut |piece| hasher.update(piece)).await?;
        Ok(hasher.finish())
    }

    async fn put_verbatim(&self, key: &str, body: Body<'_>) -> Result<super::Stored, StoreError> {
        let size = self.write(key, body, &mut |_| {}).await?;
        Ok(super::Stored::Verbatim { size })
    }

    async fn get(&self, key: &str) -> Result<Body<'static>, StoreError> {
        let path = self.path(key)?;
        match tokio::fs::File::open(&path).await {
            Ok(file) => Ok(Box::new(file)),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Err(StoreError::NotFound {
                url: self.url(),
                key: key.to_string(),
            }),
            Err(err) => Err(io(&path)(err)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let mut out = Vec::new();
        // start at the deepest folder the prefix names, not at the root: a
        // listing of one backup does not walk every backup of the store
        let start = match prefix.rsplit_once('/') {
            Some((folder, _)) if !folder.is_empty() => match self.path(folder) {
                Ok(path) => path,
                Err(_) => self.root.clone(),
            },
            _ => self.root.clone(),
        };
        let mut stack = vec![start];
        while let Some(dir) = stack.pop() {
            let mut entries = match tokio::fs::read_dir(&dir).await {
                Ok(entries) => entries,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => return Err(io(&dir)(err)),
            };
            while let Some(entry) = entries.next_entry().await.map_err(io(&dir))? {
                let path = entry.path();
                let meta = match entry.metadata().await {
                    Ok(meta) => meta,
                    // renamed or deleted since the folder was read (a
                    // `.partial` becoming its object, an object deleted):
                    // not there any more, as a listing a moment later says
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(err) => return Err(io(&path)(err)),
                };
                if meta.is_dir() {
                    stack.push(path);
                    continue;
                }
                let Ok(rel) = path.strip_prefix(&self.root) else { continue };
                let key = rel.to_string_lossy().replace('\\', "/");
                if key.ends_with(PARTIAL) || !key.starts_with(prefix) {
                    continue;
                }
                out.push(ObjectInfo {
                    key,
                    size: meta.len(),
                    modified: meta.modified().ok().map(DateTime::<Utc>::from),
                });
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Also removes an unfinished write of `key` (its `.partial` file), left
    /// when a writer was cancelled or killed.
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let path = self.path(key)?;
        let partial = PathBuf::from(format!("{}{PARTIAL}", path.display()));
        for p in [path, partial] {
            match tokio::fs::remove_file(&p).await {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(io(&p)(err)),
            }
        }
        Ok(())
    }

    async fn presign_get(&self, _key: &str, _ttl: Duration) -> Result<Option<String>, StoreError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_store_that_cannot_be_written_says_why_and_a_dry_check_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/store");
        LocalStore::new(&deep).check_writable(true).await.unwrap();
        assert!(!dir.path().join("a").exists(), "the dry check left its folders");
        LocalStore::new(&deep).check_writable(false).await.unwrap();
        assert!(deep.is_dir() && std::fs::read_dir(&deep).unwrap().next().is_none(), "the probe is removed, the folder kept");
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let err = LocalStore::new(file.join("store")).check_writable(false).await.unwrap_err().to_string();
        assert!(err.contains(&file.join("store").display().to_string()) && err.contains("Not a directory"), "{err}");
    }

    /// Objects written (`.partial`, renamed) and deleted while a listing
    /// runs never fail it: each is listed or not, as it was a moment later.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_listing_during_writes_and_deletes_does_not_fail() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(LocalStore::new(dir.path().join("store")));
        for i in 0..50 {
            store.put(&format!("c/d/kept-{i:02}"), Box::new(&b"x"[..])).await.unwrap();
        }
        let writer = {
            let store = store.clone();
            tokio::spawn(async move {
                for round in 0..200 {
                    let key = format!("c/d/churn-{}", round % 7);
                    store.put(&key, Box::new(&b"y"[..])).await.unwrap();
                    store.delete(&key).await.unwrap();
                }
            })
        };
        while !writer.is_finished() {
            let listed = store.list("c/").await.unwrap_or_else(|e| panic!("a listing failed during writes: {e}"));
            assert_eq!(listed.iter().filter(|o| o.key.contains("/kept-")).count(), 50);
        }
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn put_get_list_delete() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path().join("store"));
        let data = vec![7u8; 3 * CHUNK + 5];
        let report = store.put("b/1/snap.db", Box::new(&data[..])).await.unwrap();
        assert_eq!(report.size, data.len() as u64);
        let mut h = Hasher::default();
        h.update(&data);
        assert_eq!(report.sha256, h.finish().sha256);

        let mut back = Vec::new();
        store.get("b/1/snap.db").await.unwrap().read_to_end(&mut back).await.unwrap();
        assert_eq!(back, data);

        store.put("b/1/manifest.json", Box::new(&b"{}"[..])).await.unwrap();
        store.put("c/x", Box::new(&b"x"[..])).await.unwrap();
        let keys: Vec<_> = store.list("b/").await.unwrap().into_iter().map(|o| o.key).collect();
        assert_eq!(keys, vec!["b/1/manifest.json", "b/1/snap.db"]);
        // a prefix that is not a whole folder name still matches by prefix
        store.put("b/10/x", Box::new(&b"x"[..])).await.unwrap();
        let keys: Vec<_> = store.list("b/1").await.unwrap().into_iter().map(|o| o.key).collect();
        assert_eq!(keys, vec!["b/1/manifest.json", "b/1/snap.db", "b/10/x"]);
        let keys: Vec<_> = store.list("b/1/").await.unwrap().into_iter().map(|o| o.key).collect();
        assert_eq!(keys, vec!["b/1/manifest.json", "b/1/snap.db"]);
        assert!(store.list("nowhere/").await.unwrap().is_empty());
        assert_eq!(store.list("").await.unwrap().len(), 4);
        store.delete("b/10/x").await.unwrap();

        store.delete("b/1/snap.db").await.unwrap();
        store.delete("b/1/snap.db").await.unwrap();
        assert!(matches!(store.get("b/1/snap.db").await, Err(StoreError::NotFound { .. })));
        assert_eq!(store.presign_get("c/x", Duration::from_secs(1)).await.unwrap(), None);
    }

    #[tokio::test]
    async fn files_and_folders_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path().join("store"));
        store.put("a/b/secret", Box::new(&b"s"[..])).await.unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.path().join("store/a/b/secret")), 0o600);
        assert_eq!(mode(&dir.path().join("store/a/b")), 0o700);
        assert_eq!(mode(&dir.path().join("store/a")), 0o700);
    }

    /// A reader that fails part-way, like a snapshot stream cut by etcd.
    struct Broken(usize);
    impl tokio::io::AsyncRead for Broken {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            if self.0 == 0 {
                return std::task::Poll::Ready(Err(std::io::Error::other("stream cut")));
            }
            let n = self.0.min(buf.remaining()).min(1000);
            buf.put_slice(&vec![1u8; n]);
            self.0 -= n;
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_failed_put_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path());
        let err = store.put("x/snap.db", Box::new(Broken(5000))).await.unwrap_err();
        assert!(err.to_string().contains("stream cut"), "{err}");
        assert!(store.list("").await.unwrap().is_empty());
        assert!(!dir.path().join("x/snap.db.partial").exists());
    }

    #[tokio::test]
    async fn bad_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path());
        assert!(matches!(
            store.put("../escape", Box::new(&b""[..])).await,
            Err(StoreError::BadKey { .. })
        ));
    }
}
