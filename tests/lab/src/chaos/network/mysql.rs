//! The client→server half of the MySQL protocol, read just far enough to find COMMITs.
//!
//! Every packet is a 3-byte little-endian payload length, a sequence id and the payload. In the
//! command phase each command starts a packet with sequence id 0 whose first payload byte is
//! the command; nothing else a client sends (handshake packets, a command's continuations,
//! `LOAD DATA LOCAL` contents) has sequence 0, so "sequence 0" alone tells a command from the
//! rest without following the server's half.
//!
//! sqlx's `Transaction::commit` sends `COMMIT` as a `COM_QUERY` (0x03) text command, so that is
//! what is looked for. A `COMMIT` prepared and run with `COM_STMT_EXECUTE` is not recognised
//! (it needs the statement id from the server's answer; nothing in paybus commits that way). A
//! client that asks for TLS (an `SSLRequest`) makes the rest of its stream opaque: [`Seen::Tls`]
//! is reported once and nothing after it.

/// What the stream showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// A `COM_QUERY` `COMMIT` packet that ends at this offset of the stream (the first byte
    /// after it).
    Commit { end: u64 },
    /// The client switched to TLS: no command can be seen from here on.
    Tls,
}

const COM_QUERY: u8 = 0x03;
const CLIENT_SSL: u32 = 0x0800;
/// A payload of this length continues in the next packet.
const MAX_PAYLOAD: usize = 0x00FF_FFFF;
/// The payload bytes a packet is judged by ("COMMIT" after some whitespace).
const PEEK: usize = 64;

/// The parser's state: where it is in the byte stream and in the current packet.
#[derive(Debug, Default)]
pub(crate) struct CommandStream {
    /// Bytes fed so far.
    offset: u64,
    header: [u8; 4],
    header_len: usize,
    packet: Option<Packet>,
    /// Packets completed.
    packets: u64,
    tls: bool,
}

#[derive(Debug)]
struct Packet {
    /// Stream offset of its header.
    start: u64,
    seq: u8,
    len: usize,
    read: usize,
    /// Its first payload bytes, until judged.
    peek: Vec<u8>,
    judged: bool,
}

impl CommandStream {
    /// Reads the next bytes of the stream (any split), returning what they completed.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) -> Vec<Seen> {
        let mut seen = Vec::new();
        while !bytes.is_empty() && !self.tls {
            let Some(packet) = self.packet.as_mut() else {
                let take = (4 - self.header_len).min(bytes.len());
                self.header[self.header_len..self.header_len + take]
                    .copy_from_slice(&bytes[..take]);
                self.header_len += take;
                self.offset += take as u64;
                bytes = &bytes[take..];
                if self.header_len == 4 {
                    self.header_len = 0;
                    let [a, b, c, seq] = self.header;
                    self.packet = Some(Packet {
                        start: self.offset - 4,
                        seq,
                        len: usize::from(a) | usize::from(b) << 8 | usize::from(c) << 16,
                        read: 0,
                        peek: Vec::new(),
                        judged: false,
                    });
                    self.settle(&mut seen);
                }
                continue;
            };
            let take = (packet.len - packet.read).min(bytes.len());
            if !packet.judged {
                let wanted = PEEK.min(packet.len) - packet.peek.len();
                packet.peek.extend_from_slice(&bytes[..take.min(wanted)]);
            }
            packet.read += take;
            self.offset += take as u64;
            bytes = &bytes[take..];
            self.settle(&mut seen);
        }
        seen
    }

    /// Judges the current packet once its first bytes are in; closes it when it is complete.
    fn settle(&mut self, seen: &mut Vec<Seen>) {
        let Some(packet) = self.packet.as_mut() else {
            return;
        };
        if !packet.judged && packet.peek.len() == PEEK.min(packet.len) {
            packet.judged = true;
            if let Some(what) = judge(packet, self.packets) {
                if what == Seen::Tls {
                    self.tls = true;
                }
                seen.push(what);
            }
        }
        if packet.read == packet.len {
            self.packet = None;
            self.packets += 1;
        }
    }
}

fn judge(packet: &Packet, packets_before: u64) -> Option<Seen> {
    let payload = &packet.peek;
    if packets_before == 0 && packet.seq == 1 && packet.len == 32 && payload.len() >= 4 {
        let capabilities = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
        if capabilities & CLIENT_SSL != 0 {
            return Some(Seen::Tls);
        }
    }
    let is_commit = packet.seq == 0
        && packet.len < MAX_PAYLOAD
        && payload.first() == Some(&COM_QUERY)
        && is_commit(&payload[1..]);
    is_commit.then_some(Seen::Commit {
        end: packet.start + 4 + packet.len as u64,
    })
}

/// `COMMIT` (any case, after whitespace) as a statement of its own: `COMMIT`, `commit;`,
/// `COMMIT WORK`; not `COMMITTED` nor a text that only contains it.
fn is_commit(sql: &[u8]) -> bool {
    let start = sql
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(sql.len());
    let rest = &sql[start..];
    rest.len() >= 6
        && rest[..6].eq_ignore_ascii_case(b"COMMIT")
        && rest
            .get(6)
            .is_none_or(|b| !(b.is_ascii_alphanumeric() || *b == b'_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(seq: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut bytes = vec![len as u8, (len >> 8) as u8, (len >> 16) as u8, seq];
        bytes.extend_from_slice(payload);
        bytes
    }

    fn query(sql: &str) -> Vec<u8> {
        let mut payload = vec![COM_QUERY];
        payload.extend_from_slice(sql.as_bytes());
        packet(0, &payload)
    }

    fn handshake_response() -> Vec<u8> {
        // Capabilities without CLIENT_SSL, then max packet, charset, filler, user "root".
        let mut payload = vec![0x0f, 0xa2, 0x0a, 0x00];
        payload.extend_from_slice(&[0; 28]);
        payload.extend_from_slice(b"root\0\0");
        packet(1, &payload)
    }

    fn commits_in(stream: &[u8], split: usize) -> Vec<Seen> {
        let mut parser = CommandStream::default();
        stream
            .chunks(split.max(1))
            .flat_map(|chunk| parser.feed(chunk))
            .collect()
    }

    #[test]
    fn a_commit_is_found_with_its_end_however_the_stream_is_split() {
        let mut stream = handshake_response();
        stream.extend(query("INSERT INTO t VALUES (1)"));
        let commit_at = stream.len();
        stream.extend(query("COMMIT"));
        let end = stream.len() as u64;
        stream.extend(query("SELECT 1"));
        assert_eq!(commit_at as u64 + 11, end);
        for split in [1, 2, 3, 5, 7, 11, 64, 4096] {
            assert_eq!(
                commits_in(&stream, split),
                vec![Seen::Commit { end }],
                "split {split}"
            );
        }
    }

    #[test]
    fn only_commit_statements_of_the_command_phase_count() {
        for sql in ["COMMIT", "commit", "  Commit;", "COMMIT WORK", "\nCOMMIT"] {
            assert_eq!(commits_in(&query(sql), 3).len(), 1, "{sql:?}");
        }
        for sql in [
            "COMMITTED",
            "SELECT 'COMMIT'",
            "ROLLBACK",
            "commit_log",
            "COMMI",
            "",
        ] {
            assert!(commits_in(&query(sql), 3).is_empty(), "{sql:?}");
        }
        // The same text in a packet that is not a command's first (sequence 1), and a
        // COM_STMT_PREPARE of it, are not commits.
        let mut payload = vec![COM_QUERY];
        payload.extend_from_slice(b"COMMIT");
        assert!(commits_in(&packet(1, &payload), 4).is_empty());
        let mut prepare = vec![0x16];
        prepare.extend_from_slice(b"COMMIT");
        assert!(commits_in(&packet(0, &prepare), 4).is_empty());
    }

    #[test]
    fn a_long_query_before_a_commit_keeps_the_offsets_right() {
        let long = format!("SELECT '{}'", "x".repeat(100_000));
        let mut stream = query(&long);
        stream.extend(query("COMMIT"));
        let end = stream.len() as u64;
        assert_eq!(commits_in(&stream, 1500), vec![Seen::Commit { end }]);
    }

    #[test]
    fn a_tls_request_makes_the_rest_opaque() {
        let mut ssl_request = vec![0x0f, 0xaa, 0x0a, 0x00];
        ssl_request.extend_from_slice(&[0; 28]);
        let mut stream = packet(1, &ssl_request);
        stream.extend(query("COMMIT"));
        assert_eq!(commits_in(&stream, 9), vec![Seen::Tls]);
    }
}
