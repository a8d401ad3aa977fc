//! Byte counts of a running stage, for the progress display: a [`Meter`]
//! is shared between the code that moves the bytes (a snapshot stream, a
//! download) and whatever shows them
//! ([`crate::pipeline::runner::Observer::metering`]). A module of its own:
//! the adapters (store, etcd) count into it without depending on the
//! pipeline.
//! Counting is one relaxed atomic add per chunk; nothing waits on it.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, ReadBuf};

/// Bytes moved so far, and how many are expected when that is known.
#[derive(Debug, Clone)]
pub struct Meter(Arc<Counts>);

#[derive(Debug)]
struct Counts {
    since: Instant,
    bytes: AtomicU64,
    expected: AtomicU64,
    /// When the last bytes came, in nanoseconds after `since`.
    last: AtomicU64,
}

impl Default for Meter {
    fn default() -> Self {
        Meter::new()
    }
}

impl Meter {
    /// A meter at zero, its rate counted from now.
    pub fn new() -> Meter {
        Meter(Arc::new(Counts {
            since: Instant::now(),
            bytes: AtomicU64::new(0),
            expected: AtomicU64::new(0),
            last: AtomicU64::new(0),
        }))
    }

    /// From the meter's making to the last bytes counted: the time its
    /// rate is over (a stream that ended long ago keeps the rate it had).
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.0.last.load(Ordering::Relaxed))
    }

    /// Bytes a second while bytes came.
    pub fn rate(&self) -> f64 {
        self.bytes() as f64 / self.elapsed().as_secs_f64().max(1e-3)
    }

    /// `n` more bytes moved.
    pub fn add(&self, n: u64) {
        self.0.bytes.fetch_add(n, Ordering::Relaxed);
        let now = u64::try_from(self.0.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.0.last.fetch_max(now, Ordering::Relaxed);
    }

    /// `n` more bytes to move (each stream adds its own size when it knows it).
    pub fn expect(&self, n: u64) {
        self.0.expected.fetch_add(n, Ordering::Relaxed);
    }

    pub fn bytes(&self) -> u64 {
        self.0.bytes.load(Ordering::Relaxed)
    }

    /// The bytes expected, when any stream said (never less than moved).
    pub fn expected(&self) -> Option<u64> {
        match self.0.expected.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n.max(self.bytes())),
        }
    }

    /// `reader`, counted into this meter as it is read.
    pub fn reader<R>(&self, reader: R) -> Metered<R> {
        Metered {
            inner: reader,
            meter: self.clone(),
        }
    }
}

/// A reader whose bytes are counted into a [`Meter`].
pub struct Metered<R> {
    inner: R,
    meter: Meter,
}

impl<R: AsyncRead + Unpin> AsyncRead for Metered<R> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            self.meter.add((buf.filled().len() - before) as u64);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_metered_reader_counts_what_was_read_and_expected_is_never_below_it() {
        let meter = Meter::new();
        assert_eq!(meter.expected(), None, "nothing expected until a stream says");
        let mut reader = meter.reader(&[7u8; 10_000][..]);
        let mut half = vec![0u8; 4_000];
        reader.read_exact(&mut half).await.unwrap();
        assert_eq!(meter.bytes(), 4_000);
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).await.unwrap();
        assert_eq!(meter.bytes(), 10_000);
        // two streams said their sizes; one was short of what it moved
        meter.expect(3_000);
        meter.expect(4_000);
        assert_eq!(meter.expected(), Some(10_000));
        meter.expect(5_000);
        assert_eq!(meter.expected(), Some(12_000));
    }
}
