//! The routes of the Responses API, served by the native server itself (the state machine hands it the
//! request as a `Job`, the answer goes back to Envoy as an immediate response):
//!
//! - `POST /v1/responses`; `GET`/`DELETE /v1/responses/{id}`; `GET /v1/responses/{id}/input_items`;
//! - `POST /v1/conversations`; `GET`/`POST` (metadata)/`DELETE /v1/conversations/{id}`;
//!   `GET`/`POST /v1/conversations/{id}/items`; `GET`/`DELETE /v1/conversations/{id}/items/{item_id}`.
//!
//! A response's history (the chain of `previous_response_id`, or a conversation's items) comes from the
//! store, then one engine call is made for it, chosen by the model's router like any request, and the
//! answer is stored. Store calls run on the blocking pool (`spawn_blocking`); the engine call is made
//! by `Context::engine` (the server's `fanout`), so dropping the future (the client went away) cancels it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::mpsc::{self, UnboundedSender};

use super::events::{chat_chunks, EventWriter};
use super::items::{new_id, output_items, response_object, usage, Outcome};
use super::request::{self, check_metadata, input_item, ResponsesRequest};
use super::store::{Conversation, Order, ResponseStore, StoreError, StoredResponse};
use super::tool_loop;
use crate::auth::{model_not_allowed, Grant};
use crate::error::ApiError;
use crate::gateway::{unix_now, Gateway, ServedModel};
use crate::openai::request::GenerationRequest;
use crate::openai::response::Usage;
use crate::routing::PickRequest;
use crate::stream::{new_engine_request_id, CallOutcome, FanoutCall, GatewayCall};

/// How far back a `previous_response_id` chain is followed.
const MAX_CHAIN: usize = 1000;
/// The most items one list answers (OpenAI's limit), and its default.
const MAX_LIST: usize = 100;
const DEFAULT_LIST: usize = 20;
/// The most conversation items one response reads back as its history.
const MAX_HISTORY_ITEMS: usize = 100_000;

/// A request for one of these routes, as the state machine saw it.
pub struct Job {
    pub method: String,
    /// `:path`, query included.
    pub path: String,
    pub body: Vec<u8>,
    pub request_id: String,
    pub session: Option<String>,
    pub objective: Option<String>,
    pub subset: Option<Vec<String>>,
    pub grant: Option<Arc<Grant>>,
}

/// A streamed answer's parts before its end (`Answer` with `streamed` is the last).
#[derive(Debug, PartialEq)]
pub enum Piece {
    /// The stream starts: status 200, `text/event-stream`.
    Start,
    /// Events.
    Body(Vec<u8>),
}

/// The answer, and what the request's summary records.
pub struct Answer {
    /// The answer went out as a stream (`Piece`s): `body` is its last chunk.
    pub streamed: bool,
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    pub model: String,
    pub endpoint: String,
    pub usage: Usage,
    pub error: String,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Makes one engine call (the server's fanout, with fallbacks and deadlines).
pub type EngineCaller = Arc<dyn Fn(FanoutCall) -> BoxFuture<CallOutcome> + Send + Sync>;
/// Makes one streamed engine call: each engine message goes to the sender as it comes.
pub type StreamingEngineCaller =
    Arc<dyn Fn(FanoutCall, UnboundedSender<Bytes>) -> BoxFuture<CallOutcome> + Send + Sync>;

/// What the routes need from the server.
#[derive(Clone)]
pub struct Context {
    pub gateway: Arc<Gateway>,
    /// None: `responses_store = none` (nothing stored, chaining refused).
    pub store: Option<Arc<dyn ResponseStore>>,
    pub engine: EngineCaller,
    pub streaming_engine: StreamingEngineCaller,
}

/// Serves `job`; every failure is an OpenAI-style error answer.
/// A streamed answer's parts go to `pieces` as they come.
pub async fn serve(ctx: Context, job: Job, pieces: UnboundedSender<Piece>) -> Answer {
    let mut summary = Summary::default();
    match route(&ctx, &job, &mut summary, &pieces).await {
        Ok((content_type, body)) => Answer {
            streamed: summary.streamed,
            status: 200,
            content_type,
            body,
            model: summary.model,
            endpoint: summary.endpoint,
            usage: summary.usage,
            error: summary.error,
        },
        Err(error) => Answer {
            streamed: false,
            status: error.status,
            content_type: "application/json",
            body: error.to_json(),
            model: summary.model,
            endpoint: summary.endpoint,
            usage: summary.usage,
            error: error.message,
        },
    }
}

#[derive(Default)]
pub(super) struct Summary {
    pub(super) streamed: bool,
    pub(super) model: String,
    pub(super) endpoint: String,
    pub(super) usage: Usage,
    /// A streamed answer's failure (its status is 200 all the same).
    pub(super) error: String,
}

pub(super) type Reply = (&'static str, Vec<u8>);

pub(super) fn json_reply(value: &Value) -> Result<Reply, ApiError> {
    Ok((
        "application/json",
        serde_json::to_vec(value).map_err(|e| ApiError::internal(e.to_string()))?,
    ))
}

async fn route(
    ctx: &Context,
    job: &Job,
    summary: &mut Summary,
    pieces: &UnboundedSender<Piece>,
) -> Result<Reply, ApiError> {
    let (path, query) = job.path.split_once('?').unwrap_or((&job.path, ""));
    let segments: Vec<&str> = path.trim_matches('/').split('/').skip(1).collect();
    let method = job.method.as_str();
    match (method, segments.as_slice()) {
        ("POST", ["responses"]) => create_response(ctx, job, summary, pieces).await,
        ("GET", ["responses", id]) => json_reply(&get_response(ctx, id).await?.response),
        ("DELETE", ["responses", id]) => {
            let store = store(ctx)?;
            let id = id.to_string();
            let deleted = blocking(store, move |s| s.delete_response(&id)).await?;
            if !deleted {
                return Err(response_not_found(segments[1]));
            }
            json_reply(&json!({"id": segments[1], "object": "response.deleted", "deleted": true}))
        }
        ("GET", ["responses", id, "input_items"]) => {
            let stored = get_response(ctx, id).await?;
            let items: Vec<(String, Value)> = stored
                .input_items
                .into_iter()
                .map(|i| (i["id"].as_str().unwrap_or_default().to_string(), i))
                .collect();
            let list = ListQuery::parse(query, Order::Desc)?;
            json_reply(&list.page(items))
        }
        ("POST", ["conversations"]) => create_conversation(ctx, &job.body).await,
        ("GET", ["conversations", id]) => json_reply(&conversation_object(&get_conversation(ctx, id).await?)),
        ("POST", ["conversations", id]) => {
            let body = object_body(&job.body)?;
            let metadata = match body.get("metadata") {
                Some(Value::Object(m)) => {
                    check_metadata(m, "metadata")?;
                    Value::Object(m.clone())
                }
                _ => {
                    return Err(ApiError::invalid_param(
                        "metadata",
                        "'metadata' must be an object of strings",
                    ))
                }
            };
            let (store, key) = (store(ctx)?, id.to_string());
            let m = metadata.clone();
            if !blocking(store, move |s| s.update_conversation(&key, &m)).await? {
                return Err(conversation_not_found(id));
            }
            json_reply(&conversation_object(&get_conversation(ctx, id).await?))
        }
        ("DELETE", ["conversations", id]) => {
            let (store, key) = (store(ctx)?, id.to_string());
            if !blocking(store, move |s| s.delete_conversation(&key)).await? {
                return Err(conversation_not_found(id));
            }
            json_reply(&json!({"id": id, "object": "conversation.deleted", "deleted": true}))
        }
        ("GET", ["conversations", id, "items"]) => {
            get_conversation(ctx, id).await?;
            let list = ListQuery::parse(query, Order::Desc)?;
            let (store, key, after, order) = (store(ctx)?, id.to_string(), list.after.clone(), list.order);
            let limit = list.limit + 1;
            let items = blocking(store, move |s| s.list_items(&key, after.as_deref(), limit, order)).await?;
            let has_more = items.len() > list.limit;
            let data: Vec<Value> = items.into_iter().take(list.limit).map(|i| i.item).collect();
            json_reply(&list_object(data, has_more))
        }
        ("POST", ["conversations", id, "items"]) => {
            let body = object_body(&job.body)?;
            let items = parse_items(body.get("items"), "items")?;
            if items.is_empty() {
                return Err(ApiError::invalid_param("items", "'items' must be a non-empty list"));
            }
            let (store, key) = (store(ctx)?, id.to_string());
            let added = blocking(store, move |s| s.add_items(&key, &items)).await?;
            json_reply(&list_object(added.into_iter().map(|i| i.item).collect(), false))
        }
        ("GET", ["conversations", id, "items", item]) => {
            let (store, key, item_id) = (store(ctx)?, id.to_string(), item.to_string());
            match blocking(store, move |s| s.get_item(&key, &item_id)).await? {
                Some(found) => json_reply(&found.item),
                None => Err(item_not_found(item)),
            }
        }
        ("DELETE", ["conversations", id, "items", item]) => {
            let (store, key, item_id) = (store(ctx)?, id.to_string(), item.to_string());
            if !blocking(store, move |s| s.delete_item(&key, &item_id)).await? {
                return Err(item_not_found(item));
            }
            json_reply(&conversation_object(&get_conversation(ctx, id).await?))
        }
        (_, ["responses", ..] | ["conversations", ..]) if known_path(&segments) => Err(ApiError::new(
            405,
            "invalid_request_error",
            format!("method {method} not allowed on {path}"),
        )),
        _ => Err(ApiError::not_found(format!("no route for {path}"))),
    }
}

fn known_path(segments: &[&str]) -> bool {
    matches!(
        segments,
        ["responses"]
            | ["responses", _]
            | ["responses", _, "input_items"]
            | ["conversations"]
            | ["conversations", _]
            | ["conversations", _, "items"]
            | ["conversations", _, "items", _]
    )
}

async fn create_response(
    ctx: &Context,
    job: &Job,
    summary: &mut Summary,
    pieces: &UnboundedSender<Piece>,
) -> Result<Reply, ApiError> {
    let req = request::parse(&job.body)?;
    summary.model = req.model.clone();
    let model = model(ctx, job, &req.model)?;
    let history = history(ctx, &req).await?;
    if tool_loop::wanted(&req) {
        return tool_loop::create(ctx, job, &req, &model, history, summary, pieces).await;
    }
    let chat = request::chat_request(&req, &history)?;
    let (call, fanout) = engine_call(ctx, job, &model, &chat, req.stream)?;
    summary.endpoint = call.endpoint().to_string();
    if req.stream {
        summary.streamed = true;
        let _ = pieces.send(Piece::Start);
        let last = stream_response(ctx, &req, &model, call, fanout, pieces, summary).await;
        return Ok(("text/event-stream", last));
    }
    let outcome = (ctx.engine)(fanout).await;
    let (choice, used) = call.answer(outcome)?;
    summary.usage = used;
    let (output, cut) = output_items(&choice);
    let id = new_id("resp");
    let created_at = unix_now() as i64;
    let response = response_object(
        &req,
        Outcome {
            id: &id,
            created_at,
            model: &model.name,
            status: if cut { "incomplete" } else { "completed" },
            output: output.clone(),
            usage: Some(usage(used)),
        },
    );
    keep(ctx, &req, &id, created_at, &model.name, &response, output).await?;
    json_reply(&response)
}

/// One engine call for `chat`, routed by the model's router like any request.
pub(super) fn engine_call(
    ctx: &Context,
    job: &Job,
    model: &Arc<ServedModel>,
    chat: &GenerationRequest,
    stream: bool,
) -> Result<(GatewayCall, FanoutCall), ApiError> {
    let subset: Option<Vec<&str>> = job.subset.as_ref().map(|s| s.iter().map(String::as_str).collect());
    let routing = PickRequest {
        session_key: job.session.as_deref().or(chat.user.as_deref()),
        subset: subset.as_deref(),
        objective: job.objective.as_deref(),
        ..PickRequest::default()
    };
    let engine_request_id = new_engine_request_id();
    let limits = &ctx.gateway.limits;
    let mut call = GatewayCall::new(model, chat, &engine_request_id, routing, limits, stream)?;
    let fanout = call
        .take_call()
        .ok_or_else(|| ApiError::internal("the engine call was already made"))?;
    Ok((call, fanout))
}

/// Stores the response (unless `store: false`) and appends the exchange to its conversation.
pub(super) async fn keep(
    ctx: &Context,
    req: &ResponsesRequest,
    id: &str,
    created_at: i64,
    model: &str,
    response: &Value,
    output: Vec<Value>,
) -> Result<(), ApiError> {
    if req.store {
        if let Some(store) = ctx.store.clone() {
            let stored = StoredResponse {
                id: id.to_string(),
                created_at,
                model: model.to_string(),
                previous_response_id: req.previous_response_id.clone(),
                conversation_id: req.conversation.clone(),
                input_items: req.input.clone(),
                response: response.clone(),
            };
            let mut added = Vec::new();
            if req.conversation.is_some() {
                added.extend(req.input.iter().cloned());
                added.extend(output);
            }
            blocking(store, move |s| s.put_response(&stored, &added)).await?;
        }
    } else if let Some(conversation) = req.conversation.clone() {
        // Nothing of an unstored response is kept, but a conversation still records the exchange.
        if let Some(store) = ctx.store.clone() {
            let mut added: Vec<Value> = req.input.clone();
            added.extend(output);
            blocking(store, move |s| s.add_items(&conversation, &added).map(|_| ())).await?;
        }
    }
    Ok(())
}

/// The events of a streamed response, passed to `pieces` as the engine's messages come; returns the
/// last ones. The 200 went out already: a failure from here on is a `response.failed` event.
async fn stream_response(
    ctx: &Context,
    req: &ResponsesRequest,
    model: &ServedModel,
    mut call: GatewayCall,
    fanout: FanoutCall,
    pieces: &UnboundedSender<Piece>,
    summary: &mut Summary,
) -> Vec<u8> {
    let id = new_id("resp");
    let created_at = unix_now() as i64;
    let outcome = |status, output, usage| Outcome {
        id: &id,
        created_at,
        model: &model.name,
        status,
        output,
        usage,
    };
    let mut writer = EventWriter::start(&response_object(req, outcome("in_progress", Vec::new(), None)));
    let _ = pieces.send(Piece::Body(writer.take()));
    let (ended, finish) = pump(ctx, &mut call, fanout, &mut writer, pieces).await;
    summary.usage = call.usage();
    let cut = finish.as_deref() == Some("length");
    let output = writer.close_items(cut);
    let response = match ended {
        Ok(()) => {
            let status = if cut { "incomplete" } else { "completed" };
            let response = response_object(req, outcome(status, output.clone(), Some(usage(summary.usage))));
            match keep(ctx, req, &id, created_at, &model.name, &response, output).await {
                Ok(()) => response,
                Err(error) => failed(req, outcome("failed", Vec::new(), None), &error, summary),
            }
        }
        Err(error) => failed(req, outcome("failed", output, None), &error, summary),
    };
    writer.finish(&response);
    writer.take()
}

/// Streams one engine call's output into `writer`, its events passed to `pieces` as the engine's messages
/// come; how the call ended, and the finish reason.
pub(super) async fn pump(
    ctx: &Context,
    call: &mut GatewayCall,
    fanout: FanoutCall,
    writer: &mut EventWriter,
    pieces: &UnboundedSender<Piece>,
) -> (Result<(), ApiError>, Option<String>) {
    let mut finish: Option<String> = None;
    let mut read = |sse: &[u8], writer: &mut EventWriter| {
        for chunk in chat_chunks(sse) {
            if let Some(reason) = writer.chat_chunk(&chunk).finish_reason {
                finish = Some(reason);
            }
        }
    };
    let (sink, mut messages) = mpsc::unbounded_channel();
    let mut engine = (ctx.streaming_engine)(fanout, sink);
    let ended: Result<(), ApiError> = loop {
        tokio::select! {
            biased;
            Some(message) = messages.recv() => {
                match call.push(&message) {
                    Ok(sse) => read(&sse, writer),
                    Err(error) => break Err(error),
                }
                let _ = pieces.send(Piece::Body(writer.take()));
            }
            result = &mut engine => {
                let mut rest = Ok(());
                while let Ok(message) = messages.try_recv() {
                    match call.push(&message) {
                        Ok(sse) => read(&sse, writer),
                        Err(error) => rest = Err(error),
                    }
                }
                break result.map(|_| ()).and(rest);
            }
        }
    };
    let ended = ended
        .and_then(|()| call.finish_stream())
        .map(|tail| read(&tail, writer));
    (ended, finish)
}

/// A Response that failed after its stream began.
pub(super) fn failed(req: &ResponsesRequest, o: Outcome<'_>, error: &ApiError, summary: &mut Summary) -> Value {
    summary.error = error.message.clone();
    let mut response = response_object(req, o);
    response["error"] = json!({"code": "server_error", "message": error.message});
    response
}

fn model(ctx: &Context, job: &Job, name: &str) -> Result<Arc<ServedModel>, ApiError> {
    if let Some(grant) = &job.grant {
        if !grant.allows(name) {
            return Err(model_not_allowed(name));
        }
    }
    ctx.gateway.model(name).ok_or_else(|| {
        let mut e = ApiError::not_found(format!("The model '{name}' does not exist.")).with_code("model_not_found");
        e.param = Some("model".into());
        e
    })
}

/// The items before the request's own: each earlier response's input and output along the
/// `previous_response_id` chain, oldest first, or the conversation's items.
async fn history(ctx: &Context, req: &ResponsesRequest) -> Result<Vec<Value>, ApiError> {
    if let Some(previous) = &req.previous_response_id {
        let store = ctx.store.clone().ok_or_else(|| previous_not_found(previous))?;
        let first = previous.clone();
        let chain = blocking(store, move |s| {
            let mut chain = Vec::new();
            let mut next = Some(first);
            while let Some(id) = next {
                if chain.len() == MAX_CHAIN {
                    break;
                }
                match s.get_response(&id)? {
                    Some(stored) => {
                        next = stored.previous_response_id.clone();
                        chain.push(stored);
                    }
                    None if chain.is_empty() => return Ok(None),
                    // An earlier link was deleted: the history starts after it.
                    None => break,
                }
            }
            Ok(Some(chain))
        })
        .await?
        .ok_or_else(|| previous_not_found(previous))?;
        let mut items = Vec::new();
        for stored in chain.into_iter().rev() {
            items.extend(stored.input_items);
            items.extend(stored.response["output"].as_array().cloned().unwrap_or_default());
        }
        return Ok(items);
    }
    if let Some(conversation) = &req.conversation {
        let store = ctx.store.clone().ok_or_else(|| conversation_not_found(conversation))?;
        let key = conversation.clone();
        let found = blocking(store, move |s| {
            if s.get_conversation(&key)?.is_none() {
                return Ok(None);
            }
            s.list_items(&key, None, MAX_HISTORY_ITEMS, Order::Asc).map(Some)
        })
        .await?
        .ok_or_else(|| conversation_not_found(conversation))?;
        return Ok(found.into_iter().map(|i| i.item).collect());
    }
    Ok(Vec::new())
}

async fn get_response(ctx: &Context, id: &str) -> Result<StoredResponse, ApiError> {
    let store = ctx.store.clone().ok_or_else(|| response_not_found(id))?;
    let key = id.to_string();
    blocking(store, move |s| s.get_response(&key))
        .await?
        .ok_or_else(|| response_not_found(id))
}

async fn get_conversation(ctx: &Context, id: &str) -> Result<Conversation, ApiError> {
    let store = store(ctx)?;
    let key = id.to_string();
    blocking(store, move |s| s.get_conversation(&key))
        .await?
        .ok_or_else(|| conversation_not_found(id))
}

async fn create_conversation(ctx: &Context, body: &[u8]) -> Result<Reply, ApiError> {
    let body = object_body(body)?;
    let items = parse_items(body.get("items"), "items")?;
    let metadata = match body.get("metadata") {
        None | Some(Value::Null) => json!({}),
        Some(Value::Object(m)) => {
            check_metadata(m, "metadata")?;
            Value::Object(m.clone())
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                "metadata",
                "'metadata' must be an object of strings",
            ))
        }
    };
    let conversation = Conversation {
        id: new_id("conv"),
        created_at: unix_now() as i64,
        metadata,
    };
    let store = store(ctx)?;
    let stored = conversation.clone();
    blocking(store, move |s| s.create_conversation(&stored, &items)).await?;
    json_reply(&conversation_object(&conversation))
}

fn conversation_object(c: &Conversation) -> Value {
    json!({"id": c.id, "object": "conversation", "created_at": c.created_at, "metadata": c.metadata})
}

fn parse_items(items: Option<&Value>, param: &str) -> Result<Vec<Value>, ApiError> {
    match items {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| input_item(item, &format!("{param}[{i}]")))
            .collect(),
        Some(_) => Err(ApiError::invalid_param(
            param,
            format!("'{param}' must be a list of items"),
        )),
    }
}

/// A JSON object body; an empty body reads as `{}`.
fn object_body(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_slice(body) {
        Ok(Value::Object(obj)) => Ok(obj),
        Ok(_) => Err(ApiError::invalid("request body must be a JSON object")),
        Err(e) => Err(ApiError::invalid(format!("request body is not valid JSON: {e}"))),
    }
}

/// `after`, `limit` and `order` of a list request.
struct ListQuery {
    after: Option<String>,
    limit: usize,
    order: Order,
}

impl ListQuery {
    fn parse(query: &str, default_order: Order) -> Result<ListQuery, ApiError> {
        let mut list = ListQuery {
            after: None,
            limit: DEFAULT_LIST,
            order: default_order,
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "after" => list.after = Some(value.to_string()),
                "limit" => {
                    list.limit = value
                        .parse()
                        .ok()
                        .filter(|l| (1..=MAX_LIST).contains(l))
                        .ok_or_else(|| ApiError::invalid_param("limit", "limit must be between 1 and 100"))?;
                }
                "order" => {
                    list.order = match value {
                        "asc" => Order::Asc,
                        "desc" => Order::Desc,
                        _ => return Err(ApiError::invalid_param("order", "order must be asc or desc")),
                    }
                }
                _ => {}
            }
        }
        Ok(list)
    }

    /// One page of `items` (in stored order, with their ids).
    fn page(&self, mut items: Vec<(String, Value)>) -> Value {
        if self.order == Order::Desc {
            items.reverse();
        }
        let start = match &self.after {
            Some(after) => items
                .iter()
                .position(|(id, _)| id == after)
                .map_or(items.len(), |i| i + 1),
            None => 0,
        };
        let rest: Vec<Value> = items.into_iter().skip(start).map(|(_, v)| v).collect();
        let has_more = rest.len() > self.limit;
        list_object(rest.into_iter().take(self.limit).collect(), has_more)
    }
}

fn list_object(data: Vec<Value>, has_more: bool) -> Value {
    let first = data.first().map(|i| i["id"].clone()).unwrap_or(Value::Null);
    let last = data.last().map(|i| i["id"].clone()).unwrap_or(Value::Null);
    json!({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": has_more})
}

fn store(ctx: &Context) -> Result<Arc<dyn ResponseStore>, ApiError> {
    ctx.store.clone().ok_or_else(|| {
        ApiError::invalid("storage of responses and conversations is off on this gateway (responses_store = none)")
    })
}

/// Runs a store call on the blocking pool.
async fn blocking<T: Send + 'static>(
    store: Arc<dyn ResponseStore>,
    work: impl FnOnce(&dyn ResponseStore) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    let joined = tokio::task::spawn_blocking(move || work(&*store)).await;
    match joined {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(StoreError::ConversationNotFound(id))) => Err(conversation_not_found(&id)),
        Ok(Err(StoreError::Duplicate(what))) => Err(ApiError::invalid(format!("{what} already exists"))),
        Ok(Err(StoreError::Backend(message))) => Err(ApiError::new(
            503,
            "service_unavailable",
            format!("response storage failed: {message}"),
        )),
        Err(_) => Err(ApiError::internal("a response storage call failed")),
    }
}

fn response_not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("Response with id '{id}' not found.")).with_code("not_found")
}

fn previous_not_found(id: &str) -> ApiError {
    let mut e = response_not_found(id);
    e.param = Some("previous_response_id".into());
    e
}

fn conversation_not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("Conversation with id '{id}' not found.")).with_code("not_found")
}

fn item_not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("Item with id '{id}' not found.")).with_code("not_found")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{json, Value};

    use super::{serve, Context, Job};
    use crate::error::ApiError;
    use crate::gateway::{Gateway, Limits};
    use crate::responses::store::{MemoryStore, TenantStore};

    fn context(store: bool) -> Context {
        Context {
            gateway: Arc::new(Gateway::new(Limits::default())),
            store: store.then(|| Arc::new(TenantStore::new(Arc::new(MemoryStore::default()), None)) as _),
            engine: Arc::new(|_| Box::pin(async { Err(ApiError::internal("no engine in this test")) })),
            streaming_engine: Arc::new(|_, _| Box::pin(async { Err(ApiError::internal("no engine in this test")) })),
        }
    }

    fn call(ctx: &Context, method: &str, path: &str, body: Value) -> (u16, Value) {
        let job = Job {
            method: method.into(),
            path: path.into(),
            body: if body.is_null() {
                Vec::new()
            } else {
                serde_json::to_vec(&body).unwrap()
            },
            request_id: String::new(),
            session: None,
            objective: None,
            subset: None,
            grant: None,
        };
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (pieces, _) = tokio::sync::mpsc::unbounded_channel();
        let answer = runtime.block_on(serve(ctx.clone(), job, pieces));
        (answer.status, serde_json::from_slice(&answer.body).unwrap())
    }

    #[test]
    fn conversations_and_their_items() {
        let ctx = context(true);
        let items = json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]);
        let (status, conv) = call(
            &ctx,
            "POST",
            "/v1/conversations",
            json!({"items": items, "metadata": {"k": "v"}}),
        );
        assert_eq!(status, 200, "{conv}");
        let id = conv["id"].as_str().unwrap().to_string();
        let (_, list) = call(
            &ctx,
            "GET",
            &format!("/v1/conversations/{id}/items?order=asc&limit=1"),
            Value::Null,
        );
        assert_eq!(list["data"][0]["content"][0]["text"], "a");
        assert_eq!(list["has_more"], true);
        let first = list["first_id"].as_str().unwrap();
        let (_, rest) = call(
            &ctx,
            "GET",
            &format!("/v1/conversations/{id}/items?order=asc&after={first}"),
            Value::Null,
        );
        assert_eq!(rest["data"].as_array().unwrap().len(), 1);
        assert_eq!(rest["has_more"], false);
        let (_, desc) = call(&ctx, "GET", &format!("/v1/conversations/{id}/items"), Value::Null);
        assert_eq!(desc["data"][0]["content"][0]["text"], "b", "newest first by default");
        let (status, _) = call(
            &ctx,
            "POST",
            &format!("/v1/conversations/{id}"),
            json!({"metadata": {"k": "w"}}),
        );
        assert_eq!(status, 200);
        let (_, got) = call(&ctx, "GET", &format!("/v1/conversations/{id}"), Value::Null);
        assert_eq!(got["metadata"], json!({"k": "w"}));
        let (status, deleted) = call(&ctx, "DELETE", &format!("/v1/conversations/{id}"), Value::Null);
        assert_eq!((status, &deleted["deleted"]), (200, &json!(true)));
        let (status, _) = call(&ctx, "GET", &format!("/v1/conversations/{id}"), Value::Null);
        assert_eq!(status, 404);
    }

    #[test]
    fn unknown_ids_methods_and_paths() {
        let ctx = context(true);
        assert_eq!(call(&ctx, "GET", "/v1/responses/resp_x", Value::Null).0, 404);
        assert_eq!(call(&ctx, "DELETE", "/v1/responses/resp_x", Value::Null).0, 404);
        assert_eq!(call(&ctx, "PUT", "/v1/responses/resp_x", Value::Null).0, 405);
        assert_eq!(call(&ctx, "GET", "/v1/responses/a/b/c", Value::Null).0, 404);
        let (status, e) = call(&ctx, "POST", "/v1/responses", json!({"model": "m", "input": "x"}));
        assert_eq!((status, e["error"]["param"].as_str()), (404, Some("model")));
        // Without a store nothing can be chained or kept.
        let off = context(false);
        let (status, e) = call(&off, "POST", "/v1/conversations", json!({}));
        assert_eq!(status, 400, "{e}");
        assert_eq!(call(&off, "GET", "/v1/responses/resp_x", Value::Null).0, 404);
    }
}
