//! The in-memory store: one process, gone at exit. For tests and for `responses_store = "memory"`.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;

use super::{Conversation, ConversationItem, Order, ResponseStore, StoreError, StoredResponse};

#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    responses: HashMap<String, StoredResponse>,
    conversations: HashMap<String, (Conversation, Vec<ConversationItem>, i64)>,
}

fn item_id(item: &Value) -> Result<String, StoreError> {
    item.get("id")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| StoreError::Backend("a conversation item without an id".into()))
}

impl State {
    fn append(&mut self, conversation_id: &str, items: &[Value]) -> Result<Vec<ConversationItem>, StoreError> {
        let ids = items.iter().map(item_id).collect::<Result<Vec<_>, _>>()?;
        let (_, stored, next) = self
            .conversations
            .get_mut(conversation_id)
            .ok_or_else(|| StoreError::ConversationNotFound(conversation_id.to_owned()))?;
        let mut added = Vec::with_capacity(items.len());
        for (id, item) in ids.into_iter().zip(items) {
            let row = ConversationItem {
                id,
                conversation_id: conversation_id.to_owned(),
                position: *next,
                item: item.clone(),
            };
            *next += 1;
            stored.push(row.clone());
            added.push(row);
        }
        Ok(added)
    }
}

impl MemoryStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind, still consistent per method.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl ResponseStore for MemoryStore {
    fn put_response(&self, response: &StoredResponse, conversation_items: &[Value]) -> Result<(), StoreError> {
        let mut state = self.lock();
        if state.responses.contains_key(&response.id) {
            return Err(StoreError::Duplicate(response.id.clone()));
        }
        if let Some(conversation_id) = &response.conversation_id {
            state.append(conversation_id, conversation_items)?;
        }
        state.responses.insert(response.id.clone(), response.clone());
        Ok(())
    }

    fn get_response(&self, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        Ok(self.lock().responses.get(id).cloned())
    }

    fn delete_response(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.lock().responses.remove(id).is_some())
    }

    fn create_conversation(&self, conversation: &Conversation, items: &[Value]) -> Result<(), StoreError> {
        let mut state = self.lock();
        if state.conversations.contains_key(&conversation.id) {
            return Err(StoreError::Duplicate(conversation.id.clone()));
        }
        state
            .conversations
            .insert(conversation.id.clone(), (conversation.clone(), Vec::new(), 0));
        if let Err(error) = state.append(&conversation.id, items) {
            state.conversations.remove(&conversation.id);
            return Err(error);
        }
        Ok(())
    }

    fn get_conversation(&self, id: &str) -> Result<Option<Conversation>, StoreError> {
        Ok(self.lock().conversations.get(id).map(|(c, _, _)| c.clone()))
    }

    fn update_conversation(&self, id: &str, metadata: &Value) -> Result<bool, StoreError> {
        Ok(match self.lock().conversations.get_mut(id) {
            Some((conversation, _, _)) => {
                conversation.metadata = metadata.clone();
                true
            }
            None => false,
        })
    }

    fn delete_conversation(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.lock().conversations.remove(id).is_some())
    }

    fn add_items(&self, conversation_id: &str, items: &[Value]) -> Result<Vec<ConversationItem>, StoreError> {
        self.lock().append(conversation_id, items)
    }

    fn list_items(
        &self,
        conversation_id: &str,
        after: Option<&str>,
        limit: usize,
        order: Order,
    ) -> Result<Vec<ConversationItem>, StoreError> {
        let state = self.lock();
        let (_, items, _) = state
            .conversations
            .get(conversation_id)
            .ok_or_else(|| StoreError::ConversationNotFound(conversation_id.to_owned()))?;
        let ordered: Box<dyn Iterator<Item = &ConversationItem>> = match order {
            Order::Asc => Box::new(items.iter()),
            Order::Desc => Box::new(items.iter().rev()),
        };
        let mut ordered = ordered.peekable();
        if let Some(after) = after {
            // Skip up to and including the cursor; an unknown cursor lists nothing.
            for item in ordered.by_ref() {
                if item.id == after {
                    break;
                }
            }
        }
        Ok(ordered.take(limit).cloned().collect())
    }

    fn get_item(&self, conversation_id: &str, item_id: &str) -> Result<Option<ConversationItem>, StoreError> {
        let state = self.lock();
        let (_, items, _) = state
            .conversations
            .get(conversation_id)
            .ok_or_else(|| StoreError::ConversationNotFound(conversation_id.to_owned()))?;
        Ok(items.iter().find(|item| item.id == item_id).cloned())
    }

    fn delete_item(&self, conversation_id: &str, item_id: &str) -> Result<bool, StoreError> {
        let mut state = self.lock();
        let (_, items, _) = state
            .conversations
            .get_mut(conversation_id)
            .ok_or_else(|| StoreError::ConversationNotFound(conversation_id.to_owned()))?;
        let before = items.len();
        items.retain(|item| item.id != item_id);
        Ok(items.len() != before)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn conversation(id: &str) -> Conversation {
        Conversation {
            id: id.into(),
            created_at: 1,
            metadata: json!({}),
        }
    }

    #[test]
    fn a_response_and_its_conversation_items_are_stored_together() {
        let store = MemoryStore::default();
        store
            .create_conversation(&conversation("conv_1"), &[json!({"id": "msg_0", "type": "message"})])
            .unwrap();
        let response = StoredResponse {
            id: "resp_1".into(),
            created_at: 2,
            model: "m".into(),
            previous_response_id: None,
            conversation_id: Some("conv_1".into()),
            input_items: vec![],
            response: json!({"id": "resp_1"}),
        };
        store
            .put_response(&response, &[json!({"id": "msg_1"}), json!({"id": "msg_2"})])
            .unwrap();
        assert_eq!(store.get_response("resp_1").unwrap(), Some(response));
        let ids: Vec<_> = store
            .list_items("conv_1", None, 10, Order::Desc)
            .unwrap()
            .into_iter()
            .map(|item| item.id)
            .collect();
        assert_eq!(ids, ["msg_2", "msg_1", "msg_0"]);
        let after: Vec<_> = store
            .list_items("conv_1", Some("msg_0"), 10, Order::Asc)
            .unwrap()
            .into_iter()
            .map(|item| item.position)
            .collect();
        assert_eq!(after, [1, 2]);
    }

    #[test]
    fn a_response_into_a_deleted_conversation_is_not_stored() {
        let store = MemoryStore::default();
        let response = StoredResponse {
            id: "resp_1".into(),
            created_at: 2,
            model: "m".into(),
            previous_response_id: None,
            conversation_id: Some("conv_gone".into()),
            input_items: vec![],
            response: json!({}),
        };
        assert!(matches!(
            store.put_response(&response, &[json!({"id": "msg_1"})]),
            Err(StoreError::ConversationNotFound(_))
        ));
        assert_eq!(store.get_response("resp_1").unwrap(), None);
    }
}
