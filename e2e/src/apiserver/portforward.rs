//! The Kubernetes websocket port-forward protocol (`pods/portforward`), as
//! the kubelet speaks it with the `v4.channel.k8s.io` subprotocol and as
//! kube-rs' `Api::<Pod>::portforward` expects it.
//!
//! Wire format: every websocket message is binary, its first byte is the
//! channel. Port `i` of the request (in `?ports=` order) uses channel `2i`
//! for data and `2i+1` for errors. The server opens every channel with a
//! 3-byte frame: the channel byte and the port number as little-endian
//! `u16`. After that, data frames flow both ways on the data channels; an
//! error (such as a refused connection) is sent once, as UTF-8 text, on the
//! port's error channel and the port is then unusable. When every port's
//! target connection has ended, the server closes the websocket.
//!
//! Difference from a real cluster: connections go to `target:port` directly
//! (the emulator has no kubelet or pod network namespace), and they are
//! opened when the websocket opens, one per port, as the kubelet does.

use std::net::{IpAddr, SocketAddr};

use axum::extract::ws::{Message, WebSocket};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;

/// The websocket subprotocols this implementation speaks, in preference order.
pub const SUBPROTOCOLS: [&str; 2] = ["v4.channel.k8s.io", "portforward.k8s.io"];

/// Why a port-forward request is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortForwardError {
    /// The request names no port (`?ports=` missing or empty); a 400 for the caller.
    #[error("at least one port must be specified")]
    NoPorts,
    /// A port is not a number in 1..=65535; a 400 for the caller.
    #[error("invalid port {0:?}: must be an integer between 1 and 65535")]
    InvalidPort(String),
    /// More ports than channels (two per port, 256 channels); a 400 for the caller.
    #[error("too many ports: {0} (at most 128)")]
    TooManyPorts(usize),
}

/// Parse the `ports` query parameters of a port-forward request
/// (`ports=80,1234` or `ports=80&ports=1234`; `%2C` accepted for the comma).
pub fn parse_ports(query: &str) -> Result<Vec<u16>, PortForwardError> {
    let mut ports = Vec::new();
    for pair in query.split('&') {
        let Some((key, value)) = pair.split_once('=') else {
            continue;
        };
        if key != "ports" {
            continue;
        }
        let value = value.replace("%2C", ",").replace("%2c", ",");
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.parse::<u16>() {
                Ok(p) if p > 0 => ports.push(p),
                _ => return Err(PortForwardError::InvalidPort(part.to_string())),
            }
        }
    }
    if ports.is_empty() {
        return Err(PortForwardError::NoPorts);
    }
    if ports.len() > 128 {
        return Err(PortForwardError::TooManyPorts(ports.len()));
    }
    Ok(ports)
}

/// The frame that opens `channel` for `port`: channel byte, then the port, little-endian.
pub fn init_frame(channel: u8, port: u16) -> Vec<u8> {
    let [lo, hi] = port.to_le_bytes();
    vec![channel, lo, hi]
}

/// A data or error frame: the channel byte, then the payload.
pub fn encode_frame(channel: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 1);
    out.push(channel);
    out.extend_from_slice(payload);
    out
}

/// Split a received frame into channel and payload (None for an empty frame).
pub fn decode_frame(frame: &[u8]) -> Option<(u8, &[u8])> {
    frame.split_first().map(|(ch, rest)| (*ch, rest))
}

/// Data channel of the `index`-th port.
pub fn data_channel(index: usize) -> u8 {
    // At most 128 ports (checked by `parse_ports` and `serve`), so this fits.
    (index * 2) as u8
}

/// Error channel of the `index`-th port.
pub fn error_channel(index: usize) -> u8 {
    (index * 2 + 1) as u8
}

/// What the per-port target readers report to the websocket loop.
enum Event {
    Data(u8, Vec<u8>),
    Error(u8, String),
    Closed,
}

/// Serve one port-forward websocket: connect TCP to `target:port` for every
/// port and pipe bytes both ways until every target connection has ended or
/// the client closes the websocket.
pub async fn serve(mut ws: WebSocket, target: IpAddr, ports: Vec<u16>) {
    if ports.is_empty() || ports.len() > 128 {
        let _ = ws.send(Message::Close(None)).await;
        return;
    }
    for (i, port) in ports.iter().enumerate() {
        for ch in [data_channel(i), error_channel(i)] {
            if ws
                .send(Message::Binary(init_frame(ch, *port).into()))
                .await
                .is_err()
            {
                return;
            }
        }
    }

    let (tx, mut rx) = mpsc::channel::<Event>(64);
    let mut writers: Vec<Option<OwnedWriteHalf>> = Vec::with_capacity(ports.len());
    let mut open = 0usize;
    for (i, port) in ports.iter().enumerate() {
        let addr = SocketAddr::new(target, *port);
        match tokio::net::TcpStream::connect(addr).await {
            Ok(stream) => {
                let (mut read, write) = stream.into_split();
                writers.push(Some(write));
                open += 1;
                let tx = tx.clone();
                let ch = data_channel(i);
                let err_ch = error_channel(i);
                let port = *port;
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 32 * 1024];
                    loop {
                        match read.read(&mut buf).await {
                            Ok(0) => break,
                            Ok(n) => {
                                if tx.send(Event::Data(ch, buf[..n].to_vec())).await.is_err() {
                                    return;
                                }
                            }
                            Err(e) => {
                                let msg = format!("error forwarding port {port} to {addr}: {e}");
                                let _ = tx.send(Event::Error(err_ch, msg)).await;
                                break;
                            }
                        }
                    }
                    let _ = tx.send(Event::Closed).await;
                });
            }
            Err(e) => {
                writers.push(None);
                let msg = format!(
                    "error forwarding port {port} to pod at {addr}: failed to connect: {e}"
                );
                if ws
                    .send(Message::Binary(
                        encode_frame(error_channel(i), msg.as_bytes()).into(),
                    ))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
    drop(tx);

    if open == 0 {
        let _ = ws.send(Message::Close(None)).await;
        return;
    }

    loop {
        tokio::select! {
            incoming = ws.recv() => {
                let Some(Ok(msg)) = incoming else { break };
                match msg {
                    Message::Binary(bytes) => {
                        let Some((ch, payload)) = decode_frame(&bytes) else { continue };
                        let index = usize::from(ch / 2);
                        if ch % 2 != 0 || payload.is_empty() {
                            continue;
                        }
                        let Some(slot) = writers.get_mut(index) else {
                            // Unknown channel: a protocol error, as upstream treats it.
                            break;
                        };
                        if let Some(w) = slot && let Err(e) = w.write_all(payload).await {
                            let msg = format!("error forwarding port {}: {e}", ports[index]);
                            *slot = None;
                            let frame = encode_frame(error_channel(index), msg.as_bytes());
                            if ws.send(Message::Binary(frame.into())).await.is_err() {
                                break;
                            }
                        }
                    }
                    Message::Close(_) => break,
                    _ => {}
                }
            }
            event = rx.recv() => {
                match event {
                    Some(Event::Data(ch, data)) => {
                        if ws.send(Message::Binary(encode_frame(ch, &data).into())).await.is_err() {
                            break;
                        }
                    }
                    Some(Event::Error(ch, msg)) => {
                        if ws.send(Message::Binary(encode_frame(ch, msg.as_bytes()).into())).await.is_err() {
                            break;
                        }
                    }
                    Some(Event::Closed) => {
                        open -= 1;
                        if open == 0 {
                            let _ = ws.send(Message::Close(None)).await;
                            break;
                        }
                    }
                    None => break,
                }
            }
        }
    }
    for w in writers.iter_mut().flatten() {
        let _ = w.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message as WsMessage;

    #[test]
    fn frames_and_channels() {
        assert_eq!(init_frame(0, 8080), vec![0, 0x90, 0x1f]);
        assert_eq!(init_frame(3, 2379), vec![3, 0x4b, 0x09]);
        assert_eq!(encode_frame(2, b"hi"), vec![2, b'h', b'i']);
        assert_eq!(decode_frame(&[4, 1, 2]), Some((4, &[1u8, 2][..])));
        assert_eq!(decode_frame(&[]), None);
        assert_eq!(
            (
                data_channel(0),
                error_channel(0),
                data_channel(2),
                error_channel(2)
            ),
            (0, 1, 4, 5)
        );
    }

    #[test]
    fn ports_query() {
        assert_eq!(parse_ports("ports=80%2C1234"), Ok(vec![80, 1234]));
        assert_eq!(parse_ports("&ports=80&ports=2379"), Ok(vec![80, 2379]));
        assert_eq!(parse_ports("ports=80,1234&x=y"), Ok(vec![80, 1234]));
        assert_eq!(parse_ports(""), Err(PortForwardError::NoPorts));
        assert_eq!(
            parse_ports("ports=0"),
            Err(PortForwardError::InvalidPort("0".into()))
        );
        assert_eq!(
            parse_ports("ports=http"),
            Err(PortForwardError::InvalidPort("http".into()))
        );
    }

    /// A TCP echo server on loopback; returns its port.
    async fn echo_server() -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind echo");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = sock.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        port
    }

    /// An axum server whose only route upgrades to [`serve`].
    async fn forwarder(ports: Vec<u16>) -> String {
        use axum::extract::ws::WebSocketUpgrade;
        let app = axum::Router::new().route(
            "/pf",
            axum::routing::get(move |up: WebSocketUpgrade| {
                let ports = ports.clone();
                async move {
                    up.protocols(SUBPROTOCOLS)
                        .on_upgrade(move |ws| serve(ws, IpAddr::from([127, 0, 0, 1]), ports))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        format!("ws://{addr}/pf")
    }

    async fn connect(
        url: &str,
    ) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>
    {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut req = url.into_client_request().expect("request");
        req.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            "v5.channel.k8s.io, v4.channel.k8s.io"
                .parse()
                .expect("header"),
        );
        let (ws, resp) = tokio_tungstenite::connect_async(req)
            .await
            .expect("websocket connects");
        assert_eq!(
            resp.headers()
                .get("Sec-WebSocket-Protocol")
                .and_then(|v| v.to_str().ok()),
            Some("v4.channel.k8s.io")
        );
        ws
    }

    async fn next_binary(
        ws: &mut tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
    ) -> Vec<u8> {
        loop {
            match ws.next().await {
                Some(Ok(WsMessage::Binary(b))) => return b.to_vec(),
                Some(Ok(WsMessage::Close(_))) | None => panic!("websocket closed early"),
                Some(Ok(_)) => continue,
                Some(Err(e)) => panic!("websocket error: {e}"),
            }
        }
    }

    #[tokio::test]
    async fn pipes_bytes_to_the_target_and_back() {
        let echo = echo_server().await;
        let url = forwarder(vec![echo]).await;
        let mut ws = connect(&url).await;
        assert_eq!(next_binary(&mut ws).await, init_frame(0, echo));
        assert_eq!(next_binary(&mut ws).await, init_frame(1, echo));
        ws.send(WsMessage::Binary(encode_frame(0, b"hello").into()))
            .await
            .expect("send");
        let mut got = Vec::new();
        while got.len() < 5 {
            let frame = next_binary(&mut ws).await;
            let (ch, payload) = decode_frame(&frame).expect("frame");
            assert_eq!(ch, 0);
            got.extend_from_slice(payload);
        }
        assert_eq!(got, b"hello");
    }

    #[tokio::test]
    async fn refused_connections_are_reported_on_the_error_channel() {
        // A port nothing listens on: bind, note the port, close.
        let closed = {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            l.local_addr().expect("addr").port()
        };
        let echo = echo_server().await;
        let url = forwarder(vec![echo, closed]).await;
        let mut ws = connect(&url).await;
        let mut inits = Vec::new();
        for _ in 0..4 {
            inits.push(next_binary(&mut ws).await);
        }
        assert_eq!(
            inits,
            vec![
                init_frame(0, echo),
                init_frame(1, echo),
                init_frame(2, closed),
                init_frame(3, closed)
            ]
        );
        let frame = next_binary(&mut ws).await;
        let (ch, payload) = decode_frame(&frame).expect("frame");
        assert_eq!(ch, 3, "error channel of the second port");
        let text = String::from_utf8_lossy(payload);
        assert!(
            text.contains(&format!("error forwarding port {closed}")),
            "{text}"
        );
        // The first port still works.
        ws.send(WsMessage::Binary(encode_frame(0, b"ok").into()))
            .await
            .expect("send");
        let mut got = Vec::new();
        while got.len() < 2 {
            let frame = next_binary(&mut ws).await;
            let (ch, payload) = decode_frame(&frame).expect("frame");
            assert_eq!(ch, 0);
            got.extend_from_slice(payload);
        }
        assert_eq!(got, b"ok");
    }
}
