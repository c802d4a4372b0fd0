//! The Responses API (`/v1/responses`, `/v1/conversations`): what is stored between requests lives behind
//! one small interface (`store`), so the request path does not care whether it is SQLite, PostgreSQL or
//! nothing at all.

pub mod api;
pub mod events;
pub mod items;
pub mod mcp;
pub mod mcp_items;
pub mod mcp_tools;
pub mod request;
pub mod store;
pub mod tool_loop;
