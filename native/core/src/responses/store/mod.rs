//! Storage of responses and conversations behind one small interface.
//!
//! The trait is synchronous: SQLite is, and keeping async out of it keeps each backend simple. The request
//! path calls it from `tokio::task::spawn_blocking`, so every implementation must be callable from such a
//! thread (a blocking-pool thread of the server's runtime). Each method is one transaction: a response and
//! the conversation items it appends are written together or not at all.
//!
//! Items and response objects are stored as the JSON the API returns (OpenAI's shapes), so a read gives back
//! exactly what was answered; the columns beside them are only what lookups and ordering need.
//!
//! Every response and conversation belongs to an owner: the tenant that created it (`Owner`). A backend
//! (`StoreBackend`) holds every tenant's data and takes the owner on each call; a row of another owner is
//! treated as absent (a read finds nothing, a delete deletes nothing, an append finds no conversation), so
//! a caller cannot learn that it exists. The request path sees one tenant's view (`ResponseStore`, made by
//! `TenantStore`), so it cannot forget the owner on a call.

#[cfg(test)]
mod conformance;
mod memory;
#[cfg(test)]
mod pg_cluster;
mod postgres;
mod sqlite;
mod tenant;

use std::sync::Arc;

use serde_json::Value;

pub use self::postgres::PostgresStore;
pub use self::sqlite::SqliteStore;
pub use memory::MemoryStore;
pub use tenant::TenantStore;

/// Whose a stored response or conversation is: `Some(hash)` for the API key that created it (the key's
/// `Grant::owner`, a hash, never the key), `None` for the one tenant of a gateway without API keys (and
/// for every row stored before owners were recorded).
pub type Owner<'a> = Option<&'a str>;

/// One stored response: the object as it was answered, and what chaining by `previous_response_id` needs.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    /// `resp_…`, made by the gateway.
    pub id: String,
    /// Unix seconds.
    pub created_at: i64,
    pub model: String,
    pub previous_response_id: Option<String>,
    pub conversation_id: Option<String>,
    /// The request's input items (after `instructions` and string input were turned into items).
    pub input_items: Vec<Value>,
    /// The whole Response object as answered (status, output items, usage, metadata...).
    pub response: Value,
}

/// A conversation's own record; its items are stored apart, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    /// `conv_…`, made by the gateway.
    pub id: String,
    pub created_at: i64,
    pub metadata: Value,
}

/// One item of a conversation, in the order it was added.
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationItem {
    /// The item's own `id` field (every stored item has one; the store does not invent ids).
    pub id: String,
    pub conversation_id: String,
    /// 0, 1, 2... within the conversation: the order items were added.
    pub position: i64,
    pub item: Value,
}

/// Listing order, as the API's `order` parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Asc,
    Desc,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("conversation {0} not found")]
    ConversationNotFound(String),
    #[error("{0} already exists")]
    Duplicate(String),
    /// The backend failed (I/O, connection, SQL): the request answers 500/503, the message goes to the log.
    #[error("storage backend: {0}")]
    Backend(String),
}

/// One tenant's responses and conversations: what the request path uses (`TenantStore` binds a backend to
/// the caller's owner).
pub trait ResponseStore: Send + Sync {
    /// Stores a response and appends `conversation_items` to its conversation (when it has one), in one
    /// transaction. `ConversationNotFound` when the conversation was deleted meanwhile.
    fn put_response(&self, response: &StoredResponse, conversation_items: &[Value]) -> Result<(), StoreError>;
    fn get_response(&self, id: &str) -> Result<Option<StoredResponse>, StoreError>;
    /// True when it existed. Conversations that hold its items keep them.
    fn delete_response(&self, id: &str) -> Result<bool, StoreError>;

    fn create_conversation(&self, conversation: &Conversation, items: &[Value]) -> Result<(), StoreError>;
    fn get_conversation(&self, id: &str) -> Result<Option<Conversation>, StoreError>;
    /// Replaces the metadata; false when the conversation does not exist.
    fn update_conversation(&self, id: &str, metadata: &Value) -> Result<bool, StoreError>;
    /// Deletes the conversation and its items; true when it existed.
    fn delete_conversation(&self, id: &str) -> Result<bool, StoreError>;

    /// Appends items (each with an `id`) and returns them as stored.
    fn add_items(&self, conversation_id: &str, items: &[Value]) -> Result<Vec<ConversationItem>, StoreError>;
    /// Up to `limit` items in `order`, starting after the item with id `after` when given.
    fn list_items(
        &self,
        conversation_id: &str,
        after: Option<&str>,
        limit: usize,
        order: Order,
    ) -> Result<Vec<ConversationItem>, StoreError>;
    fn get_item(&self, conversation_id: &str, item_id: &str) -> Result<Option<ConversationItem>, StoreError>;
    /// True when it existed.
    fn delete_item(&self, conversation_id: &str, item_id: &str) -> Result<bool, StoreError>;
}

/// The storage of every tenant: `ResponseStore`'s calls, each acting only on rows of `owner`; another
/// owner's rows read as absent (nothing found, nothing deleted, `ConversationNotFound`). Ids are unique
/// across owners (the gateway makes them at random), so a `Duplicate` tells a caller nothing.
pub trait StoreBackend: Send + Sync {
    fn put_response(
        &self,
        owner: Owner<'_>,
        response: &StoredResponse,
        conversation_items: &[Value],
    ) -> Result<(), StoreError>;
    fn get_response(&self, owner: Owner<'_>, id: &str) -> Result<Option<StoredResponse>, StoreError>;
    fn delete_response(&self, owner: Owner<'_>, id: &str) -> Result<bool, StoreError>;

    fn create_conversation(
        &self,
        owner: Owner<'_>,
        conversation: &Conversation,
        items: &[Value],
    ) -> Result<(), StoreError>;
    fn get_conversation(&self, owner: Owner<'_>, id: &str) -> Result<Option<Conversation>, StoreError>;
    fn update_conversation(&self, owner: Owner<'_>, id: &str, metadata: &Value) -> Result<bool, StoreError>;
    fn delete_conversation(&self, owner: Owner<'_>, id: &str) -> Result<bool, StoreError>;

    fn add_items(
        &self,
        owner: Owner<'_>,
        conversation_id: &str,
        items: &[Value],
    ) -> Result<Vec<ConversationItem>, StoreError>;
    fn list_items(
        &self,
        owner: Owner<'_>,
        conversation_id: &str,
        after: Option<&str>,
        limit: usize,
        order: Order,
    ) -> Result<Vec<ConversationItem>, StoreError>;
    fn get_item(
        &self,
        owner: Owner<'_>,
        conversation_id: &str,
        item_id: &str,
    ) -> Result<Option<ConversationItem>, StoreError>;
    fn delete_item(&self, owner: Owner<'_>, conversation_id: &str, item_id: &str) -> Result<bool, StoreError>;
}

/// Opens the store a setting names: `memory` (tests, one process), `sqlite:PATH`, `postgres://…` or
/// `postgresql://…`; `none` is handled by the caller (nothing stored, chaining refused).
pub fn open(spec: &str) -> Result<Arc<dyn StoreBackend>, StoreError> {
    match spec {
        "memory" => Ok(Arc::new(MemoryStore::default())),
        _ if spec.starts_with("postgres://") || spec.starts_with("postgresql://") => {
            Ok(Arc::new(PostgresStore::open(spec)?))
        }
        _ if spec.starts_with("sqlite:") => Ok(Arc::new(SqliteStore::open(std::path::Path::new(
            &spec["sqlite:".len()..],
        ))?)),
        other => Err(StoreError::Backend(format!("unknown response store {other:?}"))),
    }
}
