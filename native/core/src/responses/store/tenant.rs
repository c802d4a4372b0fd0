//! One tenant's view of a backend: a `ResponseStore` whose every call goes to the backend with the
//! owner it was made for, so the request path holds no owner of its own to pass (or to forget).

use std::sync::Arc;

use serde_json::Value;

use super::{Conversation, ConversationItem, Order, ResponseStore, StoreBackend, StoreError, StoredResponse};

pub struct TenantStore {
    backend: Arc<dyn StoreBackend>,
    /// `None`: the gateway's one tenant when API keys are off.
    owner: Option<String>,
}

impl TenantStore {
    pub fn new(backend: Arc<dyn StoreBackend>, owner: Option<String>) -> Self {
        TenantStore { backend, owner }
    }

    fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }
}

impl ResponseStore for TenantStore {
    fn put_response(&self, response: &StoredResponse, conversation_items: &[Value]) -> Result<(), StoreError> {
        self.backend.put_response(self.owner(), response, conversation_items)
    }

    fn get_response(&self, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        self.backend.get_response(self.owner(), id)
    }

    fn delete_response(&self, id: &str) -> Result<bool, StoreError> {
        self.backend.delete_response(self.owner(), id)
    }

    fn create_conversation(&self, conversation: &Conversation, items: &[Value]) -> Result<(), StoreError> {
        self.backend.create_conversation(self.owner(), conversation, items)
    }

    fn get_conversation(&self, id: &str) -> Result<Option<Conversation>, StoreError> {
        self.backend.get_conversation(self.owner(), id)
    }

    fn update_conversation(&self, id: &str, metadata: &Value) -> Result<bool, StoreError> {
        self.backend.update_conversation(self.owner(), id, metadata)
    }

    fn delete_conversation(&self, id: &str) -> Result<bool, StoreError> {
        self.backend.delete_conversation(self.owner(), id)
    }

    fn add_items(&self, conversation_id: &str, items: &[Value]) -> Result<Vec<ConversationItem>, StoreError> {
        self.backend.add_items(self.owner(), conversation_id, items)
    }

    fn list_items(
        &self,
        conversation_id: &str,
        after: Option<&str>,
        limit: usize,
        order: Order,
    ) -> Result<Vec<ConversationItem>, StoreError> {
        self.backend
            .list_items(self.owner(), conversation_id, after, limit, order)
    }

    fn get_item(&self, conversation_id: &str, item_id: &str) -> Result<Option<ConversationItem>, StoreError> {
        self.backend.get_item(self.owner(), conversation_id, item_id)
    }

    fn delete_item(&self, conversation_id: &str, item_id: &str) -> Result<bool, StoreError> {
        self.backend.delete_item(self.owner(), conversation_id, item_id)
    }
}
