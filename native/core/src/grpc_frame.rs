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
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }
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
    fn rejects_compressed_and_oversized_frames() {
        let mut decoder = FrameDecoder::new(4);
        assert_eq!(decoder.push(&[1, 0, 0, 0, 1, 9]), Err(FrameError::Compressed));
        let mut decoder = FrameDecoder::new(4);
        assert_eq!(decoder.push(&encode(b"12345")), Err(FrameError::TooLarge(5)));
    }
}
