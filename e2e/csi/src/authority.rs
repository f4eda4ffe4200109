//! The kubelet's plugin watcher dials a registration socket with the socket's path as the
//! HTTP/2 `:authority` (kubernetes/kubernetes#108254: its CSI client sets `localhost`, its
//! registration dial does not). A path is no valid authority, and the Rust HTTP/2 stack under
//! tonic refuses such a request with `PROTOCOL_ERROR`. So each registration connection goes
//! through this relay: frames from the kubelet are copied unchanged, except that header blocks
//! are decoded (HPACK) and re-encoded with `:authority: localhost`; frames back are copied as
//! they are.
//!
//! The re-encoded blocks use only literals without indexing, so the relay keeps no HPACK table
//! toward the server; the decoder follows the kubelet's encoder, as the server's would.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The client connection preface every HTTP/2 connection starts with.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The default SETTINGS_MAX_FRAME_SIZE, which every peer accepts.
const MAX_FRAME: usize = 16_384;
/// The authority the relay puts in place of the kubelet's.
pub const AUTHORITY: &[u8] = b"localhost";

/// Relays one connection: `client` (the kubelet) to `server` (tonic), rewriting `:authority`.
/// Returns when either side closes.
pub async fn relay<C, S>(client: C, server: S) -> std::io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut server_read, mut server_write) = tokio::io::split(server);
    let upstream = async {
        let result = rewrite_stream(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
        result
    };
    let downstream = async {
        let result = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
        result.map(drop)
    };
    tokio::select! {
        r = upstream => r,
        r = downstream => r,
    }
}

/// Copies an HTTP/2 client stream, rewriting the authority of every header block.
async fn rewrite_stream<R, W>(from: &mut R, to: &mut W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(invalid("not an HTTP/2 connection preface"));
    }
    to.write_all(&preface).await?;
    let mut decoder = loona_hpack::Decoder::new();
    loop {
        let Some((kind, flags, stream, payload)) = read_frame(from).await? else {
            return Ok(());
        };
        if kind != HEADERS {
            write_frame(to, kind, flags, stream, &payload).await?;
            continue;
        }
        let mut block = header_fragment(flags, &payload)?.to_vec();
        let mut end = flags & END_HEADERS != 0;
        while !end {
            let (kind, more, _, payload) = read_frame(from)
                .await?
                .ok_or_else(|| invalid("connection closed inside a header block"))?;
            if kind != CONTINUATION {
                return Err(invalid("a header block interrupted by another frame"));
            }
            block.extend_from_slice(&payload);
            end = more & END_HEADERS != 0;
        }
        let headers = decoder
            .decode(&block)
            .map_err(|e| invalid(&format!("undecodable header block: {e:?}")))?;
        let block = encode_literals(&with_authority(headers));
        write_header_block(to, flags & END_STREAM, stream, &block).await?;
    }
}

/// The headers with `:authority` set to [`AUTHORITY`].
pub fn with_authority(headers: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(Vec<u8>, Vec<u8>)> {
    headers
        .into_iter()
        .map(|(name, value)| {
            if name == b":authority" {
                (name, AUTHORITY.to_vec())
            } else {
                (name, value)
            }
        })
        .collect()
}

/// An HPACK block of literal header fields without indexing, new names, no Huffman coding.
pub fn encode_literals(headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        out.push(0x00);
        for text in [name, value] {
            encode_integer(&mut out, text.len(), 7, 0x00);
            out.extend_from_slice(text);
        }
    }
    out
}

/// HPACK integer with an `prefix`-bit prefix, the byte's other bits from `first`.
fn encode_integer(out: &mut Vec<u8>, mut value: usize, prefix: u32, first: u8) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// The header block fragment of a HEADERS frame's payload, padding and priority removed.
fn header_fragment(flags: u8, payload: &[u8]) -> std::io::Result<&[u8]> {
    let mut start = 0;
    let mut end = payload.len();
    if flags & PADDED != 0 {
        let pad = *payload
            .first()
            .ok_or_else(|| invalid("empty padded frame"))? as usize;
        start += 1;
        end = end
            .checked_sub(pad)
            .ok_or_else(|| invalid("padding longer than the frame"))?;
    }
    if flags & PRIORITY != 0 {
        start += 5;
    }
    payload
        .get(start..end)
        .ok_or_else(|| invalid("a HEADERS frame shorter than its fields"))
}

async fn read_frame<R: AsyncRead + Unpin>(
    from: &mut R,
) -> std::io::Result<Option<(u8, u8, u32, Vec<u8>)>> {
    let mut head = [0u8; 9];
    match from.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    from.read_exact(&mut payload).await?;
    Ok(Some((head[3], head[4], stream, payload)))
}

async fn write_frame<W: AsyncWrite + Unpin>(
    to: &mut W,
    kind: u8,
    flags: u8,
    stream: u32,
    payload: &[u8],
) -> std::io::Result<()> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut head = [0u8; 9];
    head[..3].copy_from_slice(&len[1..]);
    head[3] = kind;
    head[4] = flags;
    head[5..].copy_from_slice(&stream.to_be_bytes());
    to.write_all(&head).await?;
    to.write_all(payload).await
}

/// A header block as a HEADERS frame and as many CONTINUATION frames as the size needs.
async fn write_header_block<W: AsyncWrite + Unpin>(
    to: &mut W,
    end_stream: u8,
    stream: u32,
    block: &[u8],
) -> std::io::Result<()> {
    let chunks: Vec<&[u8]> = if block.is_empty() {
        vec![block]
    } else {
        block.chunks(MAX_FRAME).collect()
    };
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let (kind, mut flags) = if i == 0 {
            (HEADERS, end_stream)
        } else {
            (CONTINUATION, 0)
        };
        if i == last {
            flags |= END_HEADERS;
        }
        write_frame(to, kind, flags, stream, chunk).await?;
    }
    to.flush().await
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        out.extend([kind, flags]);
        out.extend(stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    #[tokio::test]
    async fn a_path_authority_becomes_localhost_and_everything_else_passes() {
        let path = b"/var/lib/kubelet/plugins_registry/rwo.sim.podha.io-reg.sock".to_vec();
        let headers: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (b":authority", &path),
            (b"content-type", b"application/grpc"),
        ];
        // The kubelet's encoder uses Huffman coding and the dynamic table; split the block
        // over a padded HEADERS frame and a CONTINUATION frame.
        let block = loona_hpack::Encoder::new().encode(headers.iter().copied());
        let (a, b) = block.split_at(block.len() / 2);
        let mut padded = vec![3u8];
        padded.extend_from_slice(a);
        padded.extend([0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        input.extend(frame(HEADERS, PADDED, 1, &padded));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
        input.extend(frame(0x0, END_STREAM, 1, b"\0\0\0\0\0")); // DATA

        let mut out = Vec::new();
        rewrite_stream(&mut input.as_slice(), &mut out)
            .await
            .unwrap();

        let mut rest = out.strip_prefix(PREFACE).unwrap();
        let mut frames = Vec::new();
        while let Some(f) = read_frame(&mut rest).await.unwrap() {
            frames.push(f);
        }
        assert_eq!(frames.len(), 3, "{frames:?}");
        assert_eq!(frames[0], (0x4, 0, 0, vec![]));
        let (kind, flags, stream, block) = &frames[1];
        assert_eq!((*kind, *flags, *stream), (HEADERS, END_HEADERS, 1));
        let decoded = loona_hpack::Decoder::new().decode(block).unwrap();
        let expected: Vec<(Vec<u8>, Vec<u8>)> = headers
            .iter()
            .map(|(n, v)| {
                let v = if *n == b":authority" { AUTHORITY } else { v };
                (n.to_vec(), v.to_vec())
            })
            .collect();
        assert_eq!(decoded, expected);
        assert_eq!(frames[2], (0x0, END_STREAM, 1, b"\0\0\0\0\0".to_vec()));
    }

    #[test]
    fn long_values_take_multi_byte_lengths() {
        let value = vec![b'x'; 300];
        let block = encode_literals(&[(b"k".to_vec(), value.clone())]);
        let decoded = loona_hpack::Decoder::new().decode(&block).unwrap();
        assert_eq!(decoded, vec![(b"k".to_vec(), value)]);
    }

    #[tokio::test]
    async fn anything_but_http2_is_refused() {
        let mut input: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        let err = rewrite_stream(&mut input, &mut Vec::new())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    }
}
