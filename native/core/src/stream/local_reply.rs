//! Envoy's own replies to a request extproc never routed: a request-header or request timeout (408), a
//! codec error, an overload refusal. Envoy runs such a reply through the ext_proc filter's response phases
//! even when the request headers never reached extproc (the stream then begins with the response
//! headers), and waits for an answer to each message. Left unanswered, the client would get nothing and
//! the connection, and the ext_proc stream, would stay open; so the reply is passed through untouched.

use crate::pb::ext_proc::{
    processing_request::Request, processing_response::Response, HeadersResponse, ProcessingResponse, TrailersResponse,
};

use super::replies;

/// The answers to one response-side message of Envoy's own reply, and whether the reply is over; None for
/// a request-side message, which has no place in a reply.
pub(super) fn pass_through(request: &Request) -> Option<(Vec<ProcessingResponse>, bool)> {
    let reply = |response| ProcessingResponse {
        response: Some(response),
        dynamic_metadata: None,
    };
    match request {
        Request::ResponseHeaders(h) => Some((
            vec![reply(Response::ResponseHeaders(HeadersResponse { response: None }))],
            h.end_of_stream,
        )),
        // The full-duplex streamed mode hands every chunk over and wants it back.
        Request::ResponseBody(b) => Some((replies::body_chunks(&b.body, b.end_of_stream, false), b.end_of_stream)),
        Request::ResponseTrailers(_) => Some((
            vec![reply(Response::ResponseTrailers(TrailersResponse {
                header_mutation: None,
            }))],
            true,
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::pass_through;
    use crate::pb::ext_proc::{
        body_mutation::Mutation, processing_request::Request, processing_response::Response, HttpBody, HttpHeaders,
        HttpTrailers,
    };

    #[test]
    fn envoys_own_reply_passes_through_unchanged_to_its_end() {
        let (out, ended) = pass_through(&Request::ResponseHeaders(HttpHeaders {
            headers: None,
            end_of_stream: false,
        }))
        .unwrap();
        assert!(!ended);
        let [reply] = out.as_slice() else { panic!("one reply") };
        let Some(Response::ResponseHeaders(h)) = &reply.response else {
            panic!("{reply:?}")
        };
        assert!(h.response.is_none(), "the headers are left as Envoy made them");

        let body = b"request header timeout".to_vec();
        let (out, ended) = pass_through(&Request::ResponseBody(HttpBody {
            body: body.clone(),
            end_of_stream: true,
        }))
        .unwrap();
        assert!(ended);
        let [reply] = out.as_slice() else { panic!("one reply") };
        let Some(Response::ResponseBody(b)) = &reply.response else {
            panic!("{reply:?}")
        };
        let mutation = b.response.as_ref().unwrap().body_mutation.as_ref().unwrap();
        let Some(Mutation::StreamedResponse(s)) = &mutation.mutation else {
            panic!("streamed")
        };
        assert_eq!((s.body.clone(), s.end_of_stream), (body, true));

        let (_, ended) = pass_through(&Request::ResponseTrailers(HttpTrailers::default())).unwrap();
        assert!(ended);
        assert!(pass_through(&Request::RequestBody(HttpBody::default())).is_none());
    }
}
