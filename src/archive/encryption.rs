//! Client-side encryption of a backup's artifacts with [age](https://age-encryption.org/v1):
//! the objects archive (it holds the cluster's secrets) and every etcd
//! snapshot are encrypted to one or more X25519 recipients (`age1…` public
//! keys, `--encrypt-to`) while they stream to the store, and decrypted with
//! an identity file (`--identity`, as `age-keygen` writes it) while they
//! stream back. Nothing here holds a whole artifact in memory, and nothing
//! here writes plaintext to disk.
//!
//! Private keys are never printed: errors name the identity file, its line
//! number and the public keys it holds, never a line of it.

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, ReadBuf};
use tokio_util::compat::{FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt};

use crate::store::{Body, Hasher, PutReport};

/// The `scheme` the manifest records for age encryption.
pub const SCHEME: &str = "age";
/// How every age file begins (the version line follows).
pub const MAGIC: &[u8] = b"age-encryption.org/";

/// Why encrypting or decrypting could not be done.
#[derive(Debug, thiserror::Error)]
pub enum EncryptionError {
    /// A recipient that is not an age X25519 public key.
    #[error("--encrypt-to `{given}` is not an age X25519 public key: give the `age1…` line `age-keygen` prints as \"Public key\" (or `age-keygen -y KEY-FILE`)")]
    BadRecipient { given: String },
    /// The identity file could not be read.
    #[error("--identity {}: {source}", path.display())]
    IdentityRead {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A line of the identity file is not an identity (the line itself is never shown).
    #[error("--identity {}: line {line} is not an age X25519 identity (AGE-SECRET-KEY-1…): give the key file `age-keygen -o FILE` wrote (plugin and SSH identities are not supported)", path.display())]
    IdentityLine { path: PathBuf, line: usize },
    /// The identity file holds no identity at all.
    #[error("--identity {}: no identity in it: give the key file `age-keygen -o FILE` wrote", path.display())]
    IdentityEmpty { path: PathBuf },
    /// The artifact is encrypted and no identity was given.
    #[error("{what} is encrypted (age) to {}: pass --identity FILE, a key file holding the private key of one of them (what `age-keygen -o FILE` wrote)", list(recipients))]
    IdentityNeeded { what: String, recipients: Vec<String> },
    /// None of the given identities is one of the recipients.
    #[error("none of the identities in {} can decrypt {what}; the backup was encrypted to {}, and {} holds the key(s) of {}: use the key file of one of the backup's recipients", path.display(), list(recipients), path.display(), list(have))]
    NoMatchingIdentity {
        path: PathBuf,
        what: String,
        recipients: Vec<String>,
        have: Vec<String>,
    },
    /// The data is not an age file, or its header is damaged.
    #[error("{what}: not a readable age file ({message}): the backup is damaged or was tampered with; use another backup")]
    NotAge { what: String, message: String },
    /// Setting up encryption failed.
    #[error("encrypting {what}: {message}")]
    Encrypt { what: String, message: String },
}

fn list(keys: &[String]) -> String {
    if keys.is_empty() { "(no recipient recorded)".to_string() } else { keys.join(", ") }
}

/// Whether `head` (the first bytes of an artifact) is an age file.
pub fn is_age(head: &[u8]) -> bool {
    head.starts_with(MAGIC)
}

/// The recipients a backup is encrypted to (public keys; nothing secret).
#[derive(Clone)]
pub struct Recipients {
    keys: Vec<age::x25519::Recipient>,
}

impl std::fmt::Debug for Recipients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl Recipients {
    /// Parse `age1…` public keys (blank values ignored, duplicates dropped);
    /// `None` when none is given.
    pub fn parse(values: &[String]) -> Result<Option<Recipients>, EncryptionError> {
        let mut keys: Vec<age::x25519::Recipient> = Vec::new();
        for value in values.iter().map(|v| v.trim()).filter(|v| !v.is_empty()) {
            let key: age::x25519::Recipient = value.parse().map_err(|_| EncryptionError::BadRecipient {
                given: value.to_string(),
            })?;
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        Ok((!keys.is_empty()).then_some(Recipients { keys }))
    }

    /// The public keys, canonical (`age1…`), in the order given.
    pub fn names(&self) -> Vec<String> {
        self.keys.iter().map(|k| k.to_string()).collect()
    }

    fn encryptor(&self, what: &str) -> Result<age::Encryptor, EncryptionError> {
        age::Encryptor::with_recipients(self.keys.iter().map(|k| k as &dyn age::Recipient)).map_err(|e| {
            EncryptionError::Encrypt {
                what: what.to_string(),
                message: e.to_string(),
            }
        })
    }
}

/// The private keys of an identity file (never printed: `Debug` shows the
/// file and the public keys).
#[derive(Clone)]
pub struct Identities {
    path: PathBuf,
    keys: Vec<age::x25519::Identity>,
    public: Vec<String>,
}

impl std::fmt::Debug for Identities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identities")
            .field("path", &self.path)
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

impl Identities {
    /// Read an identity file as `age-keygen` writes it: `#` comments, blank
    /// lines, and one `AGE-SECRET-KEY-1…` per line.
    pub fn from_file(path: &Path) -> Result<Identities, EncryptionError> {
        let text = std::fs::read_to_string(path).map_err(|source| EncryptionError::IdentityRead {
            path: path.to_path_buf(),
            source,
        })?;
        Identities::parse(path, &text)
    }

    /// Parse the text of an identity file (`path` is for messages).
    pub fn parse(path: &Path, text: &str) -> Result<Identities, EncryptionError> {
        let mut keys = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let key: age::x25519::Identity = line.parse().map_err(|_| EncryptionError::IdentityLine {
                path: path.to_path_buf(),
                line: index + 1,
            })?;
            keys.push(key);
        }
        if keys.is_empty() {
            return Err(EncryptionError::IdentityEmpty { path: path.to_path_buf() });
        }
        let public = keys.iter().map(|k| k.to_public().to_string()).collect();
        Ok(Identities {
            path: path.to_path_buf(),
            keys,
            public,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The public keys of the identities, in file order.
    pub fn public_keys(&self) -> &[String] {
        &self.public
    }

    /// Refuse, before anything is read, when none of these identities is one
    /// of `recipients` (what the manifest recorded).
    pub fn check(&self, what: &str, recipients: &[String]) -> Result<(), EncryptionError> {
        if recipients.iter().any(|r| self.public.contains(r)) {
            return Ok(());
        }
        Err(self.no_match(what, recipients))
    }

    fn no_match(&self, what: &str, recipients: &[String]) -> EncryptionError {
        EncryptionError::NoMatchingIdentity {
            path: self.path.clone(),
            what: what.to_string(),
            recipients: recipients.to_vec(),
            have: self.public.clone(),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &dyn age::Identity> {
        self.keys.iter().map(|k| k as &dyn age::Identity)
    }

    fn decrypt_error(&self, what: &str, recipients: &[String], err: age::DecryptError) -> EncryptionError {
        match err {
            age::DecryptError::NoMatchingKeys => self.no_match(what, recipients),
            other => EncryptionError::NotAge {
                what: what.to_string(),
                message: other.to_string(),
            },
        }
    }
}

/// The size and SHA-256 of the plaintext that went through an
/// [`EncryptingReader`], once it has ended.
#[derive(Clone, Default)]
pub struct PlainDigest(Arc<Mutex<Option<PutReport>>>);

impl PlainDigest {
    /// `None` until the reader reached its end.
    pub fn get(&self) -> Option<PutReport> {
        self.0.lock().ok().and_then(|d| d.clone())
    }
}

/// Where age's writer puts ciphertext until the reader hands it on.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| io::Error::other("encryption buffer poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads plaintext from `inner` and gives the age ciphertext of it, in
/// bounded memory (age encrypts in 64 KiB chunks), hashing the plaintext on
/// the way: a body for `Store::put` that encrypts while it streams.
pub struct EncryptingReader<R> {
    inner: R,
    writer: Option<age::stream::StreamWriter<Sink>>,
    out: Sink,
    buf: Vec<u8>,
    plain: Hasher,
    digest: PlainDigest,
}

impl<R: AsyncRead + Unpin> EncryptingReader<R> {
    /// Encrypt `inner` to `recipients`; `what` names it in errors.
    pub fn new(inner: R, recipients: &Recipients, what: &str) -> Result<(EncryptingReader<R>, PlainDigest), EncryptionError> {
        let out = Sink::default();
        let writer = recipients
            .encryptor(what)?
            .wrap_output(out.clone())
            .map_err(|e| EncryptionError::Encrypt {
                what: what.to_string(),
                message: e.to_string(),
            })?;
        let digest = PlainDigest::default();
        Ok((
            EncryptingReader {
                inner,
                writer: Some(writer),
                out,
                buf: vec![0u8; 64 << 10],
                plain: Hasher::default(),
                digest: digest.clone(),
            },
            digest,
        ))
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for EncryptingReader<R> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, target: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            {
                let mut out = this.out.0.lock().map_err(|_| io::Error::other("encryption buffer poisoned"))?;
                if !out.is_empty() {
                    let n = out.len().min(target.remaining());
                    target.put_slice(&out[..n]);
                    out.drain(..n);
                    return Poll::Ready(Ok(()));
                }
            }
            if this.writer.is_none() {
                return Poll::Ready(Ok(()));
            }
            let mut read = ReadBuf::new(&mut this.buf);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let n = read.filled().len();
            if n == 0 {
                if let Some(writer) = this.writer.take() {
                    writer.finish()?;
                }
                let plain = std::mem::take(&mut this.plain);
                if let Ok(mut digest) = this.digest.0.lock() {
                    *digest = Some(plain.finish());
                }
                continue;
            }
            this.plain.update(&this.buf[..n]);
            if let Some(writer) = this.writer.as_mut() {
                writer.write_all(&this.buf[..n])?;
            }
        }
    }
}

/// Counts and hashes what is read through it into a shared [`Hasher`].
pub struct HashingReader<R> {
    inner: R,
    hasher: Arc<Mutex<Hasher>>,
}

impl<R> HashingReader<R> {
    /// The reader and a handle to read its hash from once it is done.
    pub fn new(inner: R) -> (HashingReader<R>, Arc<Mutex<Hasher>>) {
        let hasher = Arc::new(Mutex::new(Hasher::default()));
        (HashingReader { inner, hasher: hasher.clone() }, hasher)
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for HashingReader<R> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if let Ok(mut hasher) = this.hasher.lock() {
            hasher.update(&buf.filled()[before..]);
        }
        Poll::Ready(Ok(()))
    }
}

/// Decrypt an age stream as it is read: the header is read (and the
/// identities tried) here; the plaintext then streams, every 64 KiB chunk
/// authenticated before it is handed on. `what` names the artifact and
/// `recipients` are the manifest's, for messages.
pub async fn decrypting_reader<'a>(
    body: Body<'a>,
    identities: &Identities,
    what: &str,
    recipients: &[String],
) -> Result<Body<'a>, EncryptionError> {
    let decryptor = age::Decryptor::new_async(body.compat()).await.map_err(|e| EncryptionError::NotAge {
        what: what.to_string(),
        message: e.to_string(),
    })?;
    let reader = decryptor
        .decrypt_async(identities.iter())
        .map_err(|e| identities.decrypt_error(what, recipients, e))?;
    Ok(Box::new(reader.compat()))
}

/// Open an age file for random access: the plaintext can be read and
/// sought in without ever being written out (bbolt's page reads over an
/// encrypted snapshot).
pub fn decrypting_file(
    file: std::fs::File,
    identities: &Identities,
    what: &str,
    recipients: &[String],
) -> Result<DecryptedFile, EncryptionError> {
    let decryptor = age::Decryptor::new(file).map_err(|e| EncryptionError::NotAge {
        what: what.to_string(),
        message: e.to_string(),
    })?;
    let inner = decryptor
        .decrypt(identities.iter())
        .map_err(|e| identities.decrypt_error(what, recipients, e))?;
    Ok(DecryptedFile {
        inner,
        len: None,
        pos: 0,
        synced: true,
    })
}

/// The plaintext of an age file ([`decrypting_file`]), readable and
/// seekable as a file is: a position at or past the end reads 0 bytes, and
/// a seek to a negative or overflowing position is an error. age's own
/// reader (0.12) panics on both (a read after a seek past the end of its
/// last chunk subtracts past zero; large offsets overflow), so positions
/// are worked out here and age is only ever asked for one inside the
/// plaintext.
pub struct DecryptedFile {
    inner: age::stream::StreamReader<std::fs::File>,
    /// The plaintext's length once known (age authenticates the last chunk
    /// to tell it).
    len: Option<u64>,
    pos: u64,
    /// False after a seek of `inner` failed part-way: where it stands is
    /// unknown until the next seek succeeds.
    synced: bool,
}

impl DecryptedFile {
    fn len(&mut self) -> io::Result<u64> {
        if let Some(len) = self.len {
            return Ok(len);
        }
        // Before the length is known, only reads moved `pos`: it is inside the plaintext.
        self.synced = false;
        let len = self.inner.seek(SeekFrom::End(0))?;
        if self.pos < len {
            self.inner.seek(SeekFrom::Start(self.pos))?;
        }
        self.synced = true;
        self.len = Some(len);
        Ok(len)
    }
}

impl Read for DecryptedFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.len.is_some_and(|len| self.pos >= len) {
            return Ok(0);
        }
        if !self.synced {
            return Err(io::Error::other("an earlier seek in the encrypted file failed"));
        }
        let n = self.inner.read(buf)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for DecryptedFile {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(at) => Some(at),
            SeekFrom::Current(delta) => self.pos.checked_add_signed(delta),
            SeekFrom::End(delta) => self.len()?.checked_add_signed(delta),
        }
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("cannot seek to {to:?} from {}", self.pos)))?;
        if target < self.len()? {
            self.synced = false;
            self.inner.seek(SeekFrom::Start(target))?;
            self.synced = true;
        }
        self.pos = target;
        Ok(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom};
    use tokio::io::AsyncReadExt;

    fn keypair() -> (String, String) {
        let identity = age::x25519::Identity::generate();
        let secret = age::secrecy::ExposeSecret::expose_secret(&identity.to_string()).to_string();
        (secret, identity.to_public().to_string())
    }

    fn identity_file(secret: &str) -> String {
        format!("# created: 2026-11-21T18:00:00Z\n# public key: (see below)\n{secret}\n")
    }

    async fn encrypt(plain: &[u8], recipients: &Recipients) -> (Vec<u8>, PutReport) {
        let (mut reader, digest) = EncryptingReader::new(plain, recipients, "test").unwrap();
        let mut out = Vec::new();
        reader.read_to_end(&mut out).await.unwrap();
        (out, digest.get().expect("digest after the end"))
    }

    #[test]
    fn recipients_parse_and_refuse_what_is_not_a_public_key() {
        let (secret, public) = keypair();
        let r = Recipients::parse(&[public.clone(), format!(" {public} "), String::new()]).unwrap().unwrap();
        assert_eq!(r.names(), vec![public.clone()]);
        assert!(Recipients::parse(&[]).unwrap().is_none());
        let err = Recipients::parse(std::slice::from_ref(&secret)).unwrap_err().to_string();
        assert!(err.contains("is not an age X25519 public key") && err.contains("age-keygen -y"), "{err}");
        assert!(Recipients::parse(&["age1nope".into()]).is_err());
    }

    #[test]
    fn identity_files_are_read_as_age_keygen_writes_them_and_never_echoed() {
        let (secret, public) = keypair();
        let ids = Identities::parse(Path::new("key.txt"), &identity_file(&secret)).unwrap();
        assert_eq!(ids.public_keys(), std::slice::from_ref(&public));
        assert!(!format!("{ids:?}").contains(&secret), "Debug shows the private key");
        let bad = format!("# ok\n{secret}\nAGE-SECRET-KEY-1NOTAKEY-{}\n", &secret[20..]);
        let err = Identities::parse(Path::new("key.txt"), &bad).unwrap_err().to_string();
        assert!(err.contains("key.txt: line 3 is not an age X25519 identity"), "{err}");
        assert!(!err.contains(&secret[20..]), "the error echoes the file: {err}");
        let err = Identities::parse(Path::new("key.txt"), "# nothing\n").unwrap_err().to_string();
        assert!(err.contains("no identity"), "{err}");
        let (_, other) = keypair();
        ids.check("backup x", std::slice::from_ref(&public)).unwrap();
        let err = ids.check("backup x", std::slice::from_ref(&other)).unwrap_err().to_string();
        assert!(err.contains("none of the identities in key.txt can decrypt backup x"), "{err}");
        assert!(err.contains(&format!("the backup was encrypted to {other}")), "{err}");
        assert!(err.contains(&public), "{err}");
    }

    #[tokio::test]
    async fn streams_round_trip_with_both_hashes_and_any_matching_identity() {
        let (secret_a, public_a) = keypair();
        let (secret_b, public_b) = keypair();
        let recipients = Recipients::parse(&[public_a.clone(), public_b.clone()]).unwrap().unwrap();
        // several age chunks, not a multiple of the chunk size
        let plain: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let (cipher, digest) = encrypt(&plain, &recipients).await;
        assert!(is_age(&cipher));
        assert_eq!(digest.size, plain.len() as u64);
        let mut expected = Hasher::default();
        expected.update(&plain);
        assert_eq!(digest, expected.finish());
        assert!(cipher.windows(16).all(|w| w != &plain[1000..1016]), "plaintext visible in the ciphertext");

        for secret in [&secret_a, &secret_b] {
            let ids = Identities::parse(Path::new("k"), &identity_file(secret)).unwrap();
            let (hashing, cipher_hash) = HashingReader::new(&cipher[..]);
            let mut body = decrypting_reader(Box::new(hashing), &ids, "x", &recipients.names()).await.unwrap();
            let mut back = Vec::new();
            body.read_to_end(&mut back).await.unwrap();
            assert_eq!(back, plain);
            assert_eq!(std::mem::take(&mut *cipher_hash.lock().unwrap()).finish().size, cipher.len() as u64);
        }

        let (secret_c, public_c) = keypair();
        let wrong = Identities::parse(Path::new("wrong.key"), &identity_file(&secret_c)).unwrap();
        let err = match decrypting_reader(Box::new(&cipher[..]), &wrong, "etcd/etcd-0.db", &recipients.names()).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a wrong identity decrypted"),
        };
        assert!(err.contains("none of the identities in wrong.key can decrypt etcd/etcd-0.db"), "{err}");
        assert!(err.contains(&public_a) && err.contains(&public_c), "{err}");
    }

    #[tokio::test]
    async fn tampering_is_caught_while_streaming() {
        let (secret, public) = keypair();
        let recipients = Recipients::parse(&[public]).unwrap().unwrap();
        let ids = Identities::parse(Path::new("k"), &identity_file(&secret)).unwrap();
        let plain = vec![7u8; 200_000];
        let (mut cipher, _) = encrypt(&plain, &recipients).await;
        let at = cipher.len() - 1000;
        cipher[at] ^= 1;
        let mut body = decrypting_reader(Box::new(&cipher[..]), &ids, "x", &[]).await.unwrap();
        let mut back = Vec::new();
        assert!(body.read_to_end(&mut back).await.is_err(), "a flipped byte decrypted");
        let err = match decrypting_reader(Box::new(&b"not an age file at all"[..]), &ids, "objects.tar.gz", &[]).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("garbage decrypted"),
        };
        assert!(err.contains("objects.tar.gz: not a readable age file"), "{err}");
    }

    #[tokio::test]
    async fn encrypted_files_can_be_read_at_random() {
        let (secret, public) = keypair();
        let recipients = Recipients::parse(&[public]).unwrap().unwrap();
        let ids = Identities::parse(Path::new("k"), &identity_file(&secret)).unwrap();
        let plain: Vec<u8> = (0..500_000u32).map(|i| (i * 7 % 253) as u8).collect();
        let (cipher, _) = encrypt(&plain, &recipients).await;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap.db.age");
        std::fs::write(&path, &cipher).unwrap();
        let mut reader = decrypting_file(std::fs::File::open(&path).unwrap(), &ids, "snap", &[]).unwrap();
        assert_eq!(reader.seek(SeekFrom::End(0)).unwrap(), plain.len() as u64);
        for at in [400_000u64, 3, 65_536, 65_535, 131_100] {
            reader.seek(SeekFrom::Start(at)).unwrap();
            let mut buf = [0u8; 100];
            reader.read_exact(&mut buf).unwrap();
            assert_eq!(&buf[..], &plain[at as usize..at as usize + 100], "at {at}");
        }
    }

    /// Found by tests/suite/no_panic.rs: age's own reader panicked (stream.rs:469,
    /// 617, 628 and 654 of age 0.12.1) on each of these, undamaged file and all.
    #[tokio::test]
    async fn seeking_past_the_end_or_by_huge_offsets_never_panics() {
        let (secret, public) = keypair();
        let recipients = Recipients::parse(&[public]).unwrap().unwrap();
        let ids = Identities::parse(Path::new("k"), &identity_file(&secret)).unwrap();
        let plain: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        let (cipher, _) = encrypt(&plain, &recipients).await;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap.db.age");
        std::fs::write(&path, &cipher).unwrap();
        let open = || decrypting_file(std::fs::File::open(&path).unwrap(), &ids, "snap", &[]).unwrap();
        let mut buf = [0u8; 100];

        // one past the end, inside the last chunk, then a read
        let mut reader = open();
        assert_eq!(reader.seek(SeekFrom::End(0)).unwrap(), 70_000);
        assert_eq!(reader.read(&mut buf).unwrap(), 0);
        assert_eq!(reader.seek(SeekFrom::End(1)).unwrap(), 70_001);
        assert_eq!(reader.read(&mut buf).unwrap(), 0);
        // offsets that overflowed in age's arithmetic
        let mut reader = open();
        assert_eq!(reader.seek(SeekFrom::Start(u64::MAX)).unwrap(), u64::MAX);
        assert_eq!(reader.read(&mut buf).unwrap(), 0);
        let mut reader = open();
        reader.read_exact(&mut buf).unwrap();
        assert_eq!(reader.seek(SeekFrom::Current(i64::MAX)).unwrap(), 100 + i64::MAX as u64);
        assert_eq!(reader.read(&mut buf).unwrap(), 0);
        let mut reader = open();
        assert_eq!(reader.seek(SeekFrom::End(i64::MAX)).unwrap(), 70_000 + i64::MAX as u64);
        assert_eq!(reader.read(&mut buf).unwrap(), 0);
        // before the start: an error; and the reader still reads where it is sent
        reader.seek(SeekFrom::Start(10)).unwrap();
        assert!(reader.seek(SeekFrom::Current(i64::MIN)).is_err());
        assert!(reader.seek(SeekFrom::End(-70_001)).is_err());
        assert_eq!(reader.seek(SeekFrom::Start(65_500)).unwrap(), 65_500);
        reader.read_exact(&mut buf).unwrap();
        assert_eq!(&buf[..], &plain[65_500..65_600]);
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, &plain[65_600..]);
    }
}
