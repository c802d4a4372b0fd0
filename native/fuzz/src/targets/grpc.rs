//! The gRPC frame decoder and the engine response decoding behind it. Input: a flags byte (protocol,
//! streamed or not, a small or large message bound), a byte that sets how the stream is cut into body
//! chunks, then the response body. The frames must come out the same however the body is cut, and each
//! message decodes (or is refused) for both protocols with logprobs sorted most likely first.

use extproc_core::engine::Protocol;
use extproc_core::grpc_frame::{self, FrameDecoder};

use super::{engine_output, signature, Target};
use crate::rng::Rng;

pub const TARGET: Target = Target {
    name: "grpc",
    run,
    generate,
    mutate,
    dictionary,
};

fn protocol(flags: u8) -> Protocol {
    if flags & 1 == 0 {
        Protocol::Vllm
    } else {
        Protocol::Sglang
    }
}

fn run(data: &[u8]) -> u64 {
    let [flags, cut, body @ ..] = data else {
        return 0;
    };
    let max_message = if flags & 4 == 0 { 1 << 20 } else { 64 };
    let whole = FrameDecoder::new(max_message).push(body);

    // The same body in chunks of 1..=16 bytes, sizes cycling from `cut`.
    let mut chunked = FrameDecoder::new(max_message);
    let mut messages = Vec::new();
    let mut error = None;
    let mut rest = body;
    let mut step = *cut;
    while !rest.is_empty() && error.is_none() {
        let n = usize::from(step % 16 + 1).min(rest.len());
        match chunked.push(&rest[..n]) {
            Ok(more) => messages.extend(more),
            Err(e) => error = Some(e),
        }
        rest = &rest[n..];
        step = step.wrapping_mul(31).wrapping_add(7);
    }
    match (&whole, error) {
        (Ok(all), None) => {
            assert_eq!(all, &messages, "chunking changed the frames");
            let framed: usize = all.iter().map(|m| m.len() + 5).sum();
            assert_eq!(chunked.pending(), body.len() - framed);
        }
        (Err(e), Some(chunk_error)) => assert_eq!(e, &chunk_error),
        (whole, chunk_error) => panic!("whole: {whole:?}, chunked: {chunk_error:?}"),
    }

    let stream = flags & 2 != 0;
    // The distinct ways the messages decoded, not their count: a signature per kind of input.
    let mut outcomes = std::collections::BTreeSet::from([format!("{:?}", whole.as_ref().map(|m| m.is_empty()))]);
    for message in &messages {
        for p in [Protocol::Vllm, Protocol::Sglang] {
            let decoded = p.decode_response(message, stream);
            if let Ok(Some(output)) = &decoded {
                for lp in &output.logprobs {
                    assert!(lp.top.windows(2).all(|w| w[0].1.total_cmp(&w[1].1).is_ge()), "{lp:?}");
                }
                if stream && output.finish_reason.is_some() {
                    assert!(output.token_ids.is_empty(), "a streamed end repeats no tokens");
                }
            }
            outcomes.insert(match decoded {
                Ok(Some(o)) => format!("ok:{}", o.finish_reason.is_some()),
                Ok(None) => "none".into(),
                Err(e) => e,
            });
        }
    }
    signature(&outcomes.into_iter().collect::<Vec<_>>().join("|"))
}

fn generate(rng: &mut Rng) -> Vec<u8> {
    let flags = rng.below(8) as u8;
    let mut out = vec![flags, rng.next_u64() as u8];
    for _ in 0..rng.size(6) {
        out.extend(grpc_frame::encode(&engine_output::message(rng, protocol(flags))));
    }
    out
}

fn mutate(rng: &mut Rng, data: &[u8]) -> Option<Vec<u8>> {
    // Append, prepend or replace a whole frame: byte mutations mostly break the first length.
    let [flags, cut, body @ ..] = data else {
        return None;
    };
    let frame = grpc_frame::encode(&engine_output::message(rng, protocol(*flags)));
    let mut out = vec![*flags, *cut];
    match rng.below(3) {
        0 => out.extend(frame.iter().chain(body)),
        1 => out.extend(body.iter().chain(&frame)),
        _ => out.extend(frame),
    }
    Some(out)
}

fn dictionary() -> Vec<&'static [u8]> {
    vec![
        &[0, 0, 0, 0, 0],
        &[0, 0, 0, 0, 2],
        &[1, 0, 0, 0, 0],
        &[0, 0xff, 0xff, 0xff, 0xff],
        &[0x0a, 0],
        &[0x12, 0],
    ]
}
