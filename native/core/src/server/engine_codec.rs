//! The codec of the server's own engine calls (an `Abort`, a batch's `Generate`s): the engine layer
//! (`engine::Protocol`) encodes and decodes engine messages itself, since the same bytes also travel
//! gRPC-framed inside Envoy's bodies, so the calls move them as they are. (The ext_proc service itself
//! uses tonic's generated, typed server.)

use bytes::{Buf, BufMut, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// Outgoing messages are serialized protobufs (`Vec<u8>`); incoming ones arrive as `Bytes`.
#[derive(Debug, Clone, Copy, Default)]
pub struct EngineCodec;

impl Codec for EngineCodec {
    type Encode = Vec<u8>;
    type Decode = Bytes;
    type Encoder = EngineCodec;
    type Decoder = EngineCodec;

    fn encoder(&mut self) -> Self::Encoder {
        EngineCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        EngineCodec
    }
}

impl Encoder for EngineCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for EngineCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        // The buffer holds exactly one message; taking it as `Bytes` shares the receive buffer.
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
