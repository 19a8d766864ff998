//! Raw HTTP/2 for the limit tests: frames written and read by hand, so a test can send what
//! no HTTP/2 client library would and see exactly what the server answers.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use _native::GET_SERVER_INFO_PATH;
use _native::incoming::HTTP2_PREFACE;
use _native::server::MetadataServer;

use super::DEADLINE;

pub const FRAME_DATA: u8 = 0x0;
pub const FRAME_HEADERS: u8 = 0x1;
pub const FRAME_RST_STREAM: u8 = 0x3;
pub const FRAME_SETTINGS: u8 = 0x4;
pub const FRAME_PING: u8 = 0x6;
pub const FRAME_GOAWAY: u8 = 0x7;
pub const FRAME_WINDOW_UPDATE: u8 = 0x8;
pub const FLAG_END_STREAM: u8 = 0x1;
pub const FLAG_ACK: u8 = 0x1;
pub const FLAG_END_HEADERS: u8 = 0x4;
pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const REFUSED_STREAM: u32 = 0x7;
pub const CANCEL: u32 = 0x8;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;
/// What our PING carries, to tell its ACK from anything else.
pub const PING_DATA: [u8; 8] = *b"limits!!";

pub async fn raw_connect(server: &MetadataServer) -> TcpStream {
    TcpStream::connect(server.local_addr()).await.unwrap()
}

/// The preface and an empty SETTINGS frame: what a client sends before anything else.
pub async fn raw_handshake(stream: &mut TcpStream) {
    try_raw_handshake(stream).await.unwrap();
}

/// The handshake on a connection the server may already have closed (EPIPE/ECONNRESET).
pub async fn try_raw_handshake(stream: &mut TcpStream) -> std::io::Result<()> {
    stream.write_all(HTTP2_PREFACE).await?;
    stream
        .write_all(&[0, 0, 0, FRAME_SETTINGS, 0, 0, 0, 0, 0])
        .await
}

/// Next frame as (type, flags, payload); None once the server closed the connection.
pub async fn read_frame(stream: &mut TcpStream) -> Option<(u8, u8, Vec<u8>)> {
    read_frame_on(stream)
        .await
        .map(|frame| (frame.kind, frame.flags, frame.payload))
}

/// One HTTP/2 frame as read.
#[derive(Debug)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream_id: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// The error code of a RST_STREAM or GOAWAY frame.
    pub fn error_code(&self) -> u32 {
        let at = if self.kind == FRAME_GOAWAY { 4 } else { 0 };
        u32::from_be_bytes(self.payload[at..at + 4].try_into().unwrap())
    }
}

/// Next frame; None once the server closed the connection.
pub async fn read_frame_on(stream: &mut (impl AsyncRead + Unpin)) -> Option<Frame> {
    let mut header = [0u8; 9];
    stream.read_exact(&mut header).await.ok()?;
    let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    let mut payload = vec![0u8; length];
    stream.read_exact(&mut payload).await.ok()?;
    Some(Frame {
        kind: header[3],
        flags: header[4],
        stream_id: u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff,
        payload,
    })
}

/// A frame as written: 24-bit length, type, flags, stream id, payload.
pub fn frame(kind: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    bytes.extend([kind, flags]);
    bytes.extend(stream_id.to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// A request's header block, HPACK-coded by hand from static-table entries and literals
/// without indexing only, so each block stands alone (no dynamic table to keep in step).
pub fn request_headers(path: &str, content_length: Option<&str>) -> Vec<u8> {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
    hpack_literal(&mut block, 4, path);
    hpack_literal(&mut block, 1, "localhost"); // :authority
    hpack_literal(&mut block, 31, "application/grpc"); // content-type
    if let Some(value) = content_length {
        hpack_literal(&mut block, 28, value);
    }
    block
}

/// A literal header field without indexing whose name is static-table entry `name`
/// (RFC 7541 §6.2.2), its value short and not Huffman-coded.
pub fn hpack_literal(block: &mut Vec<u8>, name: u8, value: &str) {
    if name < 15 {
        block.push(name);
    } else {
        block.extend([15, name - 15]);
    }
    block.push(u8::try_from(value.len()).ok().filter(|&n| n < 127).unwrap());
    block.extend_from_slice(value.as_bytes());
}

/// HEADERS opening a GetServerInfo call on `stream_id`. Its request body stays open, so the
/// service keeps waiting for it.
pub fn open_call(stream_id: u32) -> Vec<u8> {
    let block = request_headers(GET_SERVER_INFO_PATH, None);
    frame(FRAME_HEADERS, FLAG_END_HEADERS, stream_id, &block)
}

pub fn ping() -> Vec<u8> {
    frame(FRAME_PING, 0, 0, &PING_DATA)
}

/// Writes `burst` (ending in our PING) while reading what the server sends until it answers
/// the PING, sends GOAWAY or closes. The server handles frames in order, so the ACK means
/// it has handled every frame before it.
pub async fn send_and_read(stream: &mut TcpStream, burst: &[u8]) -> Vec<Frame> {
    let (mut reader, mut writer) = stream.split();
    let read = async {
        let mut frames = Vec::new();
        while let Some(frame) = read_frame_on(&mut reader).await {
            let last = frame.kind == FRAME_GOAWAY
                || (frame.kind == FRAME_PING
                    && frame.flags & FLAG_ACK != 0
                    && frame.payload == PING_DATA);
            frames.push(frame);
            if last {
                break;
            }
        }
        frames
    };
    // After a GOAWAY the server may close before it has read the rest: not a failure.
    let (_, frames) = tokio::time::timeout(DEADLINE, async {
        tokio::join!(writer.write_all(burst), read)
    })
    .await
    .expect("the server answered the burst within the deadline");
    frames
}

pub fn goaway(frames: &[Frame]) -> Option<&Frame> {
    frames.iter().find(|frame| frame.kind == FRAME_GOAWAY)
}

/// (stream id, error code) of every RST_STREAM among `frames`.
pub fn resets(frames: &[Frame]) -> Vec<(u32, u32)> {
    frames
        .iter()
        .filter(|frame| frame.kind == FRAME_RST_STREAM)
        .map(|frame| (frame.stream_id, frame.error_code()))
        .collect()
}

/// True once the peer closed (EOF or reset), reading and discarding whatever comes first.
pub async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(DEADLINE, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await
    .is_ok()
}
