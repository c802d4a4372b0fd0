//! The MCP tool loop of a Responses request whose `tools` hold MCP servers (or whose input answers an
//! approval request):
//!
//! 1. each server's tools are listed (an `mcp_list_tools` item; a listing earlier in the chain with the same
//!    `server_label` is reused instead), filtered by `allowed_tools`, and offered to the model as function
//!    tools, so its tool-call parser reads a call to one like any other;
//! 2. approved calls (`mcp_approval_response` input items) are made; denied ones reach the model as a denial;
//! 3. then rounds: an engine call (routed like any request); the model's calls to MCP tools are made
//!    (`mcp_call` items, the result appended as a tool message) and the engine is called again, until the
//!    model answers without calling one. A call needing approval ends the Response with an
//!    `mcp_approval_request` item; a call to a function tool ends it with the `function_call` item, as
//!    without MCP. More than `responses_mcp_max_rounds` rounds end it `incomplete` (`max_tool_calls`).
//!
//! A server that cannot be reached, a tool that fails and a timeout become the item's `error`, never the
//! request's. Streamed, each item comes with its events (`events.rs`) as it is made. The whole loop is one
//! future: the client going away drops it, which cancels the engine call or MCP request in flight.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedSender;

use super::api::{engine_call, failed, json_reply, keep, pump, Context, Job, Piece, Reply, Summary};
use super::events::{EventWriter, HeldCall};
use super::items::{new_id, output_items, response_object, usage, Outcome};
use super::mcp::McpClient;
use super::mcp_items;
use super::mcp_tools::{self, function_tool, listed_tool, redacted_tools, McpServerDef};
use super::request::{chat_request_over, ResponsesRequest};
use crate::error::ApiError;
use crate::gateway::{unix_now, ServedModel};
use crate::openai::response::Usage;

/// Bounds each request to an MCP server (connect, list, call): a slow tool is an error item after this.
const MCP_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether the request needs the loop: MCP tools, or an answer to an approval request.
pub fn wanted(req: &ResponsesRequest) -> bool {
    mcp_tools::any(&req.body) || req.input.iter().any(|i| i["type"] == "mcp_approval_response")
}

/// Why a Response ended `incomplete`.
type Incomplete = Option<&'static str>;

struct Server {
    def: McpServerDef,
    /// The listed tools it may call (`mcp_list_tools`' shape).
    tools: Vec<Value>,
    /// Opened by the listing, or by the first call when the listing was reused.
    client: Option<McpClient>,
}

struct Stream<'a> {
    writer: EventWriter,
    pieces: &'a UnboundedSender<Piece>,
}

impl Stream<'_> {
    fn flush(&mut self) {
        let _ = self.pieces.send(Piece::Body(self.writer.take()));
    }
}

struct ToolLoop<'a> {
    ctx: &'a Context,
    job: &'a Job,
    req: &'a ResponsesRequest,
    model: &'a Arc<ServedModel>,
    /// The history and the request's input: what the output follows.
    before: Vec<Value>,
    servers: Vec<Server>,
    /// An MCP tool's name → its server (the first server listing it; function tools keep their names).
    routes: HashMap<String, usize>,
    output: Vec<Value>,
    usage: Usage,
    endpoint: String,
    stream: Option<Stream<'a>>,
}

/// Serves a Response through the loop. `history`: the stored items before the request's own.
pub(super) async fn create(
    ctx: &Context,
    job: &Job,
    req: &ResponsesRequest,
    model: &Arc<ServedModel>,
    history: Vec<Value>,
    summary: &mut Summary,
    pieces: &UnboundedSender<Piece>,
) -> Result<Reply, ApiError> {
    let defs = mcp_tools::parse(&req.body)?;
    let mut before = history;
    before.extend(req.input.iter().cloned());
    let approvals = approvals(req, &before, &defs)?;
    let mut run = ToolLoop {
        ctx,
        job,
        req,
        model,
        before,
        servers: defs
            .into_iter()
            .map(|def| Server {
                def,
                tools: Vec::new(),
                client: None,
            })
            .collect(),
        routes: HashMap::new(),
        output: Vec::new(),
        usage: Usage::default(),
        endpoint: String::new(),
        stream: None,
    };
    let id = new_id("resp");
    let created_at = unix_now() as i64;
    let response = |output: Vec<Value>, status: &str, used: Option<Usage>| {
        let mut response = response_object(
            req,
            Outcome {
                id: &id,
                created_at,
                model: &model.name,
                status,
                output,
                usage: used.map(usage),
            },
        );
        response["tools"] = redacted_tools(&response["tools"]);
        response
    };
    if req.stream {
        summary.streamed = true;
        let _ = pieces.send(Piece::Start);
        let mut stream = Stream {
            writer: EventWriter::start(&response(Vec::new(), "in_progress", None)),
            pieces,
        };
        stream.flush();
        run.stream = Some(stream);
    }
    let ended = run.run(approvals).await;
    summary.usage = run.usage;
    summary.endpoint = std::mem::take(&mut run.endpoint);
    let output = std::mem::take(&mut run.output);
    let finished = ended.map(|incomplete| {
        let status = if incomplete.is_some() {
            "incomplete"
        } else {
            "completed"
        };
        let mut done = response(output.clone(), status, Some(run.usage));
        if let Some(reason) = incomplete {
            done["incomplete_details"] = json!({"reason": reason});
        }
        done
    });
    let Some(mut stream) = run.stream.take() else {
        let done = finished?;
        keep(ctx, req, &id, created_at, &model.name, &done, output).await?;
        return json_reply(&done);
    };
    // The 200 went out already: a failure from here on is a `response.failed` event.
    let as_failed = |error: &ApiError, output: Vec<Value>, summary: &mut Summary| {
        let mut r = failed(
            req,
            Outcome {
                id: &id,
                created_at,
                model: &model.name,
                status: "failed",
                output,
                usage: None,
            },
            error,
            summary,
        );
        r["tools"] = redacted_tools(&r["tools"]);
        r
    };
    let last = match finished {
        Ok(done) => match keep(ctx, req, &id, created_at, &model.name, &done, output).await {
            Ok(()) => done,
            Err(error) => as_failed(&error, Vec::new(), summary),
        },
        Err(error) => as_failed(&error, output, summary),
    };
    stream.writer.finish(&last);
    Ok(("text/event-stream", stream.writer.take()))
}

/// The approval requests the input answers, with their server and the answer. A request the chain does not
/// hold, or whose server the request's tools lack, is a 400.
fn approvals(
    req: &ResponsesRequest,
    before: &[Value],
    defs: &[McpServerDef],
) -> Result<Vec<(usize, Value, bool)>, ApiError> {
    let mut out = Vec::new();
    for (i, item) in req.input.iter().enumerate() {
        if item["type"] != "mcp_approval_response" {
            continue;
        }
        let param = format!("input[{i}].approval_request_id");
        let wanted = &item["approval_request_id"];
        let request = before
            .iter()
            .find(|b| b["type"] == "mcp_approval_request" && &b["id"] == wanted)
            .ok_or_else(|| {
                ApiError::invalid_param(&param, format!("no approval request {wanted} in this conversation"))
                    .with_code("invalid_value")
            })?;
        let label = request["server_label"].as_str().unwrap_or_default();
        let server = defs.iter().position(|d| d.label == label).ok_or_else(|| {
            ApiError::invalid_param(
                &param,
                format!("the approved call is to MCP server '{label}', which the request's tools do not hold"),
            )
            .with_code("invalid_value")
        })?;
        let answered = before
            .iter()
            .any(|b| b["type"] == "mcp_call" && &b["approval_request_id"] == wanted);
        if !answered {
            out.push((server, request.clone(), item["approve"] == true));
        }
    }
    Ok(out)
}

impl ToolLoop<'_> {
    async fn run(&mut self, approvals: Vec<(usize, Value, bool)>) -> Result<Incomplete, ApiError> {
        self.list_tools().await;
        for (server, request, approve) in approvals {
            if approve {
                let (name, arguments) = (request["name"].as_str(), request["arguments"].as_str());
                let id = request["id"].as_str();
                self.call(server, id, name.unwrap_or_default(), arguments.unwrap_or_default())
                    .await;
            }
        }
        let max_rounds = self.ctx.gateway.limits.responses_mcp_max_rounds;
        let mut rounds = 0;
        loop {
            let (turn, calls, cut) = self.turn().await?;
            let calls_a_function = turn.iter().any(|i| i["type"] == "function_call");
            self.output.extend(turn);
            if cut {
                return Ok(Some("max_output_tokens"));
            }
            if calls.is_empty() {
                return Ok(None);
            }
            if rounds == max_rounds {
                return Ok(Some("max_tool_calls"));
            }
            rounds += 1;
            let mut waits = false;
            for call in calls {
                let server = self.routes[&call.name];
                let def = &self.servers[server].def;
                if def.needs_approval(&call.name) {
                    let item = mcp_items::approval_request(&def.label, &call.name, &call.arguments);
                    if let Some(stream) = &mut self.stream {
                        stream.writer.whole_item(item.clone());
                        stream.flush();
                    }
                    self.output.push(item);
                    waits = true;
                } else {
                    self.call(server, None, &call.name, &call.arguments).await;
                }
            }
            if waits || calls_a_function {
                return Ok(None);
            }
        }
    }

    /// Lists each server's tools (or reuses the chain's listing) and routes their names.
    async fn list_tools(&mut self) {
        for i in 0..self.servers.len() {
            let label = self.servers[i].def.label.clone();
            let reused =
                self.before.iter().rev().find(|b| {
                    b["type"] == "mcp_list_tools" && b["server_label"] == label.as_str() && b["error"].is_null()
                });
            if let Some(listing) = reused {
                let server = &mut self.servers[i];
                let tools = listing["tools"].as_array().into_iter().flatten();
                server.tools = tools
                    .filter(|t| t["name"].as_str().is_some_and(|n| server.def.allows(n)))
                    .cloned()
                    .collect();
                continue;
            }
            let id = new_id("mcpl");
            if let Some(stream) = &mut self.stream {
                stream
                    .writer
                    .mcp_list_started(&mcp_items::list_tools(&id, &label, Vec::new(), None));
                stream.flush();
            }
            let server = &mut self.servers[i];
            let listed = async {
                let client = McpClient::connect(&server.def.url, &server.def.headers, MCP_TIMEOUT).await?;
                let tools = client.list_tools().await?;
                Ok::<_, super::mcp::McpError>((client, tools))
            }
            .await;
            let item = match listed {
                Ok((client, tools)) => {
                    server.client = Some(client);
                    server.tools = tools
                        .iter()
                        .filter(|t| server.def.allows(&t.name))
                        .map(listed_tool)
                        .collect();
                    mcp_items::list_tools(&id, &label, server.tools.clone(), None)
                }
                Err(error) => mcp_items::list_tools(&id, &label, Vec::new(), Some(error.to_string())),
            };
            if let Some(stream) = &mut self.stream {
                stream.writer.mcp_list_done(item.clone());
                stream.flush();
            }
            self.output.push(item);
        }
        let functions: Vec<&str> = match self.req.body.get("tools") {
            Some(Value::Array(tools)) => tools
                .iter()
                .filter(|t| t["type"] == "function")
                .filter_map(|t| t["name"].as_str())
                .collect(),
            _ => Vec::new(),
        };
        for (i, server) in self.servers.iter().enumerate() {
            for name in server.tools.iter().filter_map(|t| t["name"].as_str()) {
                if !functions.contains(&name) {
                    self.routes.entry(name.to_string()).or_insert(i);
                }
            }
        }
        if let Some(stream) = &mut self.stream {
            stream.writer.hold_calls_to(self.routes.keys().cloned().collect());
        }
    }

    /// The MCP tools as chat function tools, each name once.
    fn function_tools(&self) -> Vec<Value> {
        let mut tools = Vec::new();
        for (i, server) in self.servers.iter().enumerate() {
            for tool in &server.tools {
                let routed = tool["name"].as_str().and_then(|n| self.routes.get(n)) == Some(&i);
                if routed {
                    tools.push(function_tool(tool));
                }
            }
        }
        tools
    }

    /// One engine call over everything so far: its items, its calls to MCP tools, and whether the token
    /// limit cut it.
    async fn turn(&mut self) -> Result<(Vec<Value>, Vec<HeldCall>, bool), ApiError> {
        let mut items = self.before.clone();
        items.extend(self.output.iter().cloned());
        let chat = chat_request_over(self.req, &items, &self.function_tools())?;
        let (mut call, fanout) = engine_call(self.ctx, self.job, self.model, &chat, self.stream.is_some())?;
        self.endpoint = call.endpoint().to_string();
        if let Some(stream) = &mut self.stream {
            let (ended, finish) = pump(self.ctx, &mut call, fanout, &mut stream.writer, stream.pieces).await;
            add(&mut self.usage, call.usage());
            ended?;
            let cut = finish.as_deref() == Some("length");
            let turn = stream.writer.end_turn(cut);
            stream.flush();
            return Ok((turn, stream.writer.take_held(), cut));
        }
        let outcome = (self.ctx.engine)(fanout).await;
        let (choice, used) = call.answer(outcome)?;
        add(&mut self.usage, used);
        let (items, cut) = output_items(&choice);
        let (calls, turn): (Vec<Value>, Vec<Value>) = items.into_iter().partition(|i| {
            i["type"] == "function_call" && i["name"].as_str().is_some_and(|n| self.routes.contains_key(n))
        });
        let calls = calls
            .into_iter()
            .map(|c| HeldCall {
                call_id: c["call_id"].as_str().unwrap_or_default().to_string(),
                name: c["name"].as_str().unwrap_or_default().to_string(),
                arguments: c["arguments"].as_str().unwrap_or_default().to_string(),
            })
            .collect();
        Ok((turn, calls, cut))
    }

    /// Calls a tool and adds its `mcp_call` item, with the output or the error.
    async fn call(&mut self, server: usize, approval_request_id: Option<&str>, name: &str, arguments: &str) {
        let label = self.servers[server].def.label.clone();
        let item = mcp_items::call(&label, name, arguments, approval_request_id);
        if let Some(stream) = &mut self.stream {
            stream.writer.mcp_call_started(&item);
            stream.flush();
        }
        let result = call_tool(&mut self.servers[server], name, arguments).await;
        let item = mcp_items::call_ended(item, result);
        if let Some(stream) = &mut self.stream {
            stream.writer.mcp_call_done(item.clone());
            stream.flush();
        }
        self.output.push(item);
    }
}

/// Calls `name` on the server (connecting first if the listing was reused): its output, or why not.
async fn call_tool(server: &mut Server, name: &str, arguments: &str) -> Result<String, String> {
    if !server.def.allows(name) {
        return Err(format!(
            "tool '{name}' is not in the allowed_tools of MCP server '{}'",
            server.def.label
        ));
    }
    let arguments: Value = match arguments.trim() {
        "" => json!({}),
        text => serde_json::from_str(text).map_err(|e| format!("the call's arguments are not JSON: {e}"))?,
    };
    if server.client.is_none() {
        let client = McpClient::connect(&server.def.url, &server.def.headers, MCP_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        server.client = Some(client);
    }
    let client = server.client.as_ref().expect("connected above");
    let result = client.call_tool(name, &arguments).await.map_err(|e| e.to_string())?;
    if result.is_error {
        Err(result.output)
    } else {
        Ok(result.output)
    }
}

fn add(total: &mut Usage, more: Usage) {
    total.prompt_tokens += more.prompt_tokens;
    total.completion_tokens += more.completion_tokens;
    total.cached_tokens += more.cached_tokens;
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::{approvals, wanted};
    use crate::responses::mcp_tools;
    use crate::responses::request::parse;

    fn request(input: Value) -> crate::responses::request::ResponsesRequest {
        let body = json!({
            "model": "m", "input": input,
            "tools": [{"type": "mcp", "server_label": "calc", "server_url": "http://127.0.0.1:9/mcp"}],
        });
        parse(&serde_json::to_vec(&body).unwrap()).unwrap()
    }

    #[test]
    fn approval_answers_find_their_request_and_server() {
        let asked = json!({"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "calc", "name": "add",
            "arguments": "{}"});
        let req = request(json!([{"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": true}]));
        assert!(wanted(&req));
        let defs = mcp_tools::parse(&req.body).unwrap();
        let mut before = vec![asked.clone()];
        before.extend(req.input.iter().cloned());
        let found = approvals(&req, &before, &defs).unwrap();
        assert_eq!(found, vec![(0, asked.clone(), true)]);
        // Answered already (the approved call is in the chain): not made twice.
        let made = json!({"type": "mcp_call", "approval_request_id": "mcpr_1"});
        let again = [vec![asked.clone(), made], req.input.clone()].concat();
        assert!(approvals(&req, &again, &defs).unwrap().is_empty());
        // Unknown request, or a server the request's tools lack: 400 naming the answer.
        let e = approvals(&req, &req.input, &defs).unwrap_err();
        assert_eq!(
            (e.status, e.param.as_deref()),
            (400, Some("input[0].approval_request_id"))
        );
        let e = approvals(&req, &before, &[]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[0].approval_request_id"));
    }

    #[test]
    fn only_mcp_requests_take_the_loop() {
        assert!(wanted(&request(json!("Hi"))));
        let plain = parse(br#"{"model": "m", "input": "Hi", "tools": [{"type": "function", "name": "f"}]}"#).unwrap();
        assert!(!wanted(&plain));
    }
}
