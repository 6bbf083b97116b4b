//! The gRPC codec of Switchyard's own services: prost, with 1 KiB starting
//! buffers instead of tonic's 8 KiB. Every open stream holds one encode and
//! one decode buffer for its whole life, and a token event is a few dozen
//! bytes; larger messages grow the buffer as they need.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::ProstCodec;

/// Starting size of a stream's encode and decode buffers.
const BUFFER_BYTES: usize = 1024;
/// Encoded bytes after which a busy stream yields (tonic's default).
const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`ProstCodec`] with small starting buffers (wired in by `build.rs`).
#[derive(Debug, Clone, Copy)]
pub struct SmallBufferCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SmallBufferCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for SmallBufferCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = <ProstCodec<T, U> as Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD))
    }
}
