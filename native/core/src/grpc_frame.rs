//! gRPC length-prefixed message framing: a 1-byte compressed flag, a 4-byte big-endian length, the
//! message. Response bodies arrive from Envoy in arbitrary chunks, so decoding is incremental.

/// Frame one uncompressed message.
pub fn encode(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

#[derive(Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The engine compressed a message; the gateway never offers compression, so this is a fault.
    Compressed,
    /// A frame larger than the configured bound (a corrupt or hostile stream).
    TooLarge(usize),
}

/// Reassembles frames across body chunks.
#[derive(Debug)]
pub struct FrameDecoder {
    buffer: Vec<u8>,
    max_message: usize,
}

impl FrameDecoder {
    pub fn new(max_message: usize) -> Self {
        FrameDecoder {
            buffer: Vec::new(),
            max_message,
        }
    }

    /// Append a chunk and return every message it completes, in order.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Vec<u8>>, FrameError> {
        self.buffer.extend_from_slice(chunk);
        let mut messages = Vec::new();
        let mut start = 0;
        while self.buffer.len() - start >= 5 {
            let header = &self.buffer[start..start + 5];
            if header[0] != 0 {
                return Err(FrameError::Compressed);
            }
            let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
            if len > self.max_message {
                return Err(FrameError::TooLarge(len));
            }
            if self.buffer.len() - start - 5 < len {
                break;
            }
            messages.push(self.buffer[start + 5..start + 5 + len].to_vec());
            start += 5 + len;
        }
        self.buffer.drain(..start);
        Ok(messages)
    }

    /// Bytes of an incomplete frame still held.
    /// `push`, handing each whole message to `each` in order instead of collecting copies: the messages
    /// that arrive whole in `chunk` are read in place (the per-token path). A frame error (detected before
    /// any message is handed on, as `push` does) comes back through `frame_error`; an error of `each`
    /// stops there, the chunk's whole messages consumed either way.
    pub fn push_each<E>(
        &mut self,
        chunk: &[u8],
        frame_error: impl FnOnce(FrameError) -> E,
        mut each: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        if self.buffer.is_empty() {
            let end = self.whole_messages(chunk).map_err(frame_error)?;
            self.buffer.extend_from_slice(&chunk[end..]);
            return each_message(&chunk[..end], &mut each);
        }
        self.buffer.extend_from_slice(chunk);
        let end = self.whole_messages(&self.buffer).map_err(frame_error)?;
        let buffer = std::mem::take(&mut self.buffer);
        let handed = each_message(&buffer[..end], &mut each);
        self.buffer = buffer;
        self.buffer.drain(..end);
        handed
    }

    /// How many leading bytes of `bytes` are whole messages, checking each header as `push` does.
    fn whole_messages(&self, bytes: &[u8]) -> Result<usize, FrameError> {
        let mut start = 0;
        while bytes.len() - start >= 5 {
            let header = &bytes[start..start + 5];
            if header[0] != 0 {
                return Err(FrameError::Compressed);
            }
            let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
            if len > self.max_message {
                return Err(FrameError::TooLarge(len));
            }
            if bytes.len() - start - 5 < len {
                break;
            }
            start += 5 + len;
        }
        Ok(start)
    }

    pub fn pending(&self) -> usize {
        self.buffer.len()
    }
}

/// Each message of `bytes`, whole messages only (checked by `whole_messages`).
fn each_message<E>(mut bytes: &[u8], each: &mut impl FnMut(&[u8]) -> Result<(), E>) -> Result<(), E> {
    while bytes.len() >= 5 {
        let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
        each(&bytes[5..5 + len])?;
        bytes = &bytes[5 + len..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reassembles_frames_split_at_every_byte() {
        let stream: Vec<u8> = [encode(b"hello"), encode(b""), encode(&[7u8; 300])].concat();
        for split in 0..stream.len() {
            let mut decoder = FrameDecoder::new(1 << 20);
            let mut got = decoder.push(&stream[..split]).unwrap();
            got.extend(decoder.push(&stream[split..]).unwrap());
            assert_eq!(got, vec![b"hello".to_vec(), vec![], vec![7u8; 300]], "split at {split}");
            assert_eq!(decoder.pending(), 0);
        }
    }

    #[test]
    fn push_each_hands_on_what_push_returns_at_every_split() {
        let stream: Vec<u8> = [encode(b"hello"), encode(b""), encode(&[7u8; 300]), encode(b"end")].concat();
        for first in 0..stream.len() {
            for second in first..stream.len() {
                let mut decoder = FrameDecoder::new(1 << 20);
                let mut got: Vec<Vec<u8>> = Vec::new();
                for part in [&stream[..first], &stream[first..second], &stream[second..]] {
                    let pushed = decoder.push_each(
                        part,
                        |e| format!("{e:?}"),
                        |m| {
                            got.push(m.to_vec());
                            Ok::<(), String>(())
                        },
                    );
                    pushed.unwrap();
                }
                let expected = vec![b"hello".to_vec(), vec![], vec![7u8; 300], b"end".to_vec()];
                assert_eq!(got, expected, "split at {first}, {second}");
                assert_eq!(decoder.pending(), 0);
            }
        }
        let mut decoder = FrameDecoder::new(4);
        let frames = [encode(b"ok"), encode(b"12345")].concat();
        let mut handed = 0;
        let pushed = decoder.push_each(
            &frames,
            |e| e,
            |_| {
                handed += 1;
                Ok(())
            },
        );
        assert_eq!(
            (pushed, handed),
            (Err(FrameError::TooLarge(5)), 0),
            "nothing handed on before a bad frame"
        );
    }

    #[test]
    fn rejects_compressed_and_oversized_frames() {
        let mut decoder = FrameDecoder::new(4);
        assert_eq!(decoder.push(&[1, 0, 0, 0, 1, 9]), Err(FrameError::Compressed));
        let mut decoder = FrameDecoder::new(4);
        assert_eq!(decoder.push(&encode(b"12345")), Err(FrameError::TooLarge(5)));
    }
}
