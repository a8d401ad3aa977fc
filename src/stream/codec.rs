//! A segment's stored bytes: its raw JSON lines in one zstd frame with
//! its content checksum (`archive::compression`, as backups compress
//! their snapshots), then age-encrypted when the chain is
//! (`archive::encryption`, as backups are). Segments are small (cut at
//! `--segment-size`), so they are encoded in memory: the SHA-256 of the
//! stored bytes is known before they are written, and goes in the name.

use tokio::io::AsyncReadExt;

use super::StreamError;
use super::format::{Coding, MAX_SEGMENT_RAW};
use crate::archive::compression;
use crate::archive::encryption::{EncryptingReader, Identities, Recipients};
use crate::store::{Body, Hasher, PutReport};

fn io(what: &str) -> impl FnOnce(std::io::Error) -> StreamError + '_ {
    move |source| StreamError::Io { what: what.to_string(), source }
}

/// The bytes to store for the raw segment `raw`, and their size and SHA-256.
pub async fn seal(raw: &[u8], level: i32, recipients: Option<&Recipients>, what: &str) -> Result<(Vec<u8>, PutReport), StreamError> {
    let (compressed, _) = compression::compressing(raw, level).map_err(io(what))?;
    let mut reader: Body<'_> = match recipients {
        Some(recipients) => Box::new(EncryptingReader::new(compressed, recipients, what)?.0),
        None => Box::new(compressed),
    };
    let mut stored = Vec::with_capacity(raw.len() / 3 + 1024);
    reader.read_to_end(&mut stored).await.map_err(io(what))?;
    let mut hasher = Hasher::default();
    hasher.update(&stored);
    Ok((stored, hasher.finish()))
}

/// The raw segment of stored bytes `stored` (named `what` in errors):
/// decrypted with `identities` when the chain is encrypted, then
/// decompressed (a damaged frame fails its checksum; more than
/// [`MAX_SEGMENT_RAW`] bytes is refused).
pub async fn open(stored: &[u8], coding: &Coding, identities: Option<&Identities>, what: &str) -> Result<Vec<u8>, StreamError> {
    let recipients = (!coding.recipients.is_empty()).then_some(coding.recipients.as_slice());
    let body: Body<'_> = Box::new(stored);
    let decrypted = compression::decode(body, what, recipients, identities, None).await?;
    let reader = compression::decompressing_unbounded(decrypted, what).map_err(io(what))?;
    let mut raw = Vec::new();
    reader.take(MAX_SEGMENT_RAW + 1).read_to_end(&mut raw).await.map_err(io(what))?;
    if raw.len() as u64 > MAX_SEGMENT_RAW {
        return Err(StreamError::Io {
            what: what.to_string(),
            source: std::io::Error::other(format!("decompresses past {MAX_SEGMENT_RAW} bytes, more than any segment holds: it is damaged or was tampered with")),
        });
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coding(recipients: Vec<String>) -> Coding {
        Coding { compression: "zstd".into(), level: 1, recipients }
    }

    #[tokio::test]
    async fn sealed_segments_open_to_their_raw_bytes() {
        let raw = b"{\"revision\":1}\n".repeat(2000);
        let (stored, digest) = seal(&raw, 1, None, "seg").await.unwrap();
        assert!(compression::is_zstd(&stored));
        assert!(stored.len() < raw.len() / 10);
        assert_eq!(digest.size, stored.len() as u64);
        assert_eq!(open(&stored, &coding(Vec::new()), None, "seg").await.unwrap(), raw);
    }

    #[tokio::test]
    async fn a_flipped_or_cut_frame_fails_its_checksum() {
        let raw: Vec<u8> = (0..200_000u32).flat_map(|i| format!("{{\"r\":{i}}}\n").into_bytes()).collect();
        let (stored, _) = seal(&raw, 1, None, "seg").await.unwrap();
        let mut flipped = stored.clone();
        let at = flipped.len() / 2;
        flipped[at] ^= 0x10;
        let err = open(&flipped, &coding(Vec::new()), None, "segments/x.seg").await.unwrap_err().to_string();
        assert!(err.contains("segments/x.seg") && err.contains("damaged"), "{err}");
        let err = open(&stored[..stored.len() - 7], &coding(Vec::new()), None, "segments/x.seg").await.unwrap_err().to_string();
        assert!(err.contains("segments/x.seg"), "{err}");
    }

    #[tokio::test]
    async fn encrypted_segments_need_the_identity() {
        let identity = age::x25519::Identity::generate();
        let public = identity.to_public().to_string();
        let secret = age::secrecy::ExposeSecret::expose_secret(&identity.to_string()).to_string();
        let recipients = Recipients::parse(std::slice::from_ref(&public)).unwrap().unwrap();
        let raw = b"{\"secret\":\"value\"}\n".repeat(100);
        let (stored, _) = seal(&raw, 1, Some(&recipients), "seg").await.unwrap();
        assert!(crate::archive::encryption::is_age(&stored));
        let err = open(&stored, &coding(vec![public.clone()]), None, "seg").await.unwrap_err().to_string();
        assert!(err.contains("--identity"), "{err}");
        let ids = Identities::parse(std::path::Path::new("key"), &secret).unwrap();
        assert_eq!(open(&stored, &coding(vec![public]), Some(&ids), "seg").await.unwrap(), raw);
    }
}
