//! The in-memory store: one process, gone at exit. For tests and for `responses_store = "memory"`.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;

use super::{Conversation, ConversationItem, Order, Owner, StoreBackend, StoreError, StoredResponse};

#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Each response with its owner.
    responses: HashMap<String, (Option<String>, StoredResponse)>,
    conversations: HashMap<String, Stored>,
}

/// A conversation, its owner and its items.
struct Stored {
    owner: Option<String>,
    conversation: Conversation,
    items: Vec<ConversationItem>,
    /// The position the next item gets: never reused, even after deletes.
    next: i64,
}

fn item_id(item: &Value) -> Result<String, StoreError> {
    item.get("id")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| StoreError::Backend("a conversation item without an id".into()))
}

impl State {
    /// The owner's conversation; another owner's reads as absent.
    fn conversation(&self, owner: Owner<'_>, id: &str) -> Result<&Stored, StoreError> {
        self.conversations
            .get(id)
            .filter(|c| c.owner.as_deref() == owner)
            .ok_or_else(|| StoreError::ConversationNotFound(id.to_owned()))
    }

    fn conversation_mut(&mut self, owner: Owner<'_>, id: &str) -> Result<&mut Stored, StoreError> {
        self.conversations
            .get_mut(id)
            .filter(|c| c.owner.as_deref() == owner)
            .ok_or_else(|| StoreError::ConversationNotFound(id.to_owned()))
    }

    fn response(&self, owner: Owner<'_>, id: &str) -> Option<&StoredResponse> {
        self.responses
            .get(id)
            .filter(|(o, _)| o.as_deref() == owner)
            .map(|(_, r)| r)
    }

    fn append(
        &mut self,
        owner: Owner<'_>,
        conversation_id: &str,
        items: &[Value],
    ) -> Result<Vec<ConversationItem>, StoreError> {
        let ids = items.iter().map(item_id).collect::<Result<Vec<_>, _>>()?;
        let Stored {
            items: stored, next, ..
        } = self.conversation_mut(owner, conversation_id)?;
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

impl StoreBackend for MemoryStore {
    fn put_response(
        &self,
        owner: Owner<'_>,
        response: &StoredResponse,
        conversation_items: &[Value],
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        if state.responses.contains_key(&response.id) {
            return Err(StoreError::Duplicate(response.id.clone()));
        }
        if let Some(conversation_id) = &response.conversation_id {
            state.append(owner, conversation_id, conversation_items)?;
        }
        state
            .responses
            .insert(response.id.clone(), (owner.map(str::to_owned), response.clone()));
        Ok(())
    }

    fn get_response(&self, owner: Owner<'_>, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        Ok(self.lock().response(owner, id).cloned())
    }

    fn delete_response(&self, owner: Owner<'_>, id: &str) -> Result<bool, StoreError> {
        let mut state = self.lock();
        let found = state.response(owner, id).is_some();
        if found {
            state.responses.remove(id);
        }
        Ok(found)
    }

    fn create_conversation(
        &self,
        owner: Owner<'_>,
        conversation: &Conversation,
        items: &[Value],
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        if state.conversations.contains_key(&conversation.id) {
            return Err(StoreError::Duplicate(conversation.id.clone()));
        }
        let stored = Stored {
            owner: owner.map(str::to_owned),
            conversation: conversation.clone(),
            items: Vec::new(),
            next: 0,
        };
        state.conversations.insert(conversation.id.clone(), stored);
        if let Err(error) = state.append(owner, &conversation.id, items) {
            state.conversations.remove(&conversation.id);
            return Err(error);
        }
        Ok(())
    }

    fn get_conversation(&self, owner: Owner<'_>, id: &str) -> Result<Option<Conversation>, StoreError> {
        Ok(self.lock().conversation(owner, id).ok().map(|c| c.conversation.clone()))
    }

    fn update_conversation(&self, owner: Owner<'_>, id: &str, metadata: &Value) -> Result<bool, StoreError> {
        Ok(match self.lock().conversation_mut(owner, id) {
            Ok(stored) => {
                stored.conversation.metadata = metadata.clone();
                true
            }
            Err(_) => false,
        })
    }

    fn delete_conversation(&self, owner: Owner<'_>, id: &str) -> Result<bool, StoreError> {
        let mut state = self.lock();
        let found = state.conversation(owner, id).is_ok();
        if found {
            state.conversations.remove(id);
        }
        Ok(found)
    }

    fn add_items(
        &self,
        owner: Owner<'_>,
        conversation_id: &str,
        items: &[Value],
    ) -> Result<Vec<ConversationItem>, StoreError> {
        self.lock().append(owner, conversation_id, items)
    }

    fn list_items(
        &self,
        owner: Owner<'_>,
        conversation_id: &str,
        after: Option<&str>,
        limit: usize,
        order: Order,
    ) -> Result<Vec<ConversationItem>, StoreError> {
        let state = self.lock();
        let items = &state.conversation(owner, conversation_id)?.items;
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

    fn get_item(
        &self,
        owner: Owner<'_>,
        conversation_id: &str,
        item_id: &str,
    ) -> Result<Option<ConversationItem>, StoreError> {
        let state = self.lock();
        let items = &state.conversation(owner, conversation_id)?.items;
        Ok(items.iter().find(|item| item.id == item_id).cloned())
    }

    fn delete_item(&self, owner: Owner<'_>, conversation_id: &str, item_id: &str) -> Result<bool, StoreError> {
        let mut state = self.lock();
        let items = &mut state.conversation_mut(owner, conversation_id)?.items;
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
            .create_conversation(
                None,
                &conversation("conv_1"),
                &[json!({"id": "msg_0", "type": "message"})],
            )
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
            .put_response(None, &response, &[json!({"id": "msg_1"}), json!({"id": "msg_2"})])
            .unwrap();
        assert_eq!(store.get_response(None, "resp_1").unwrap(), Some(response));
        let ids: Vec<_> = store
            .list_items(None, "conv_1", None, 10, Order::Desc)
            .unwrap()
            .into_iter()
            .map(|item| item.id)
            .collect();
        assert_eq!(ids, ["msg_2", "msg_1", "msg_0"]);
        let after: Vec<_> = store
            .list_items(None, "conv_1", Some("msg_0"), 10, Order::Asc)
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
            store.put_response(None, &response, &[json!({"id": "msg_1"})]),
            Err(StoreError::ConversationNotFound(_))
        ));
        assert_eq!(store.get_response(None, "resp_1").unwrap(), None);
    }
}
