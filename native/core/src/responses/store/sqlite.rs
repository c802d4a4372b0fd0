//! The embedded SQLite store (`sqlite:PATH`): the default, one file in the stack's state directory.
//!
//! One connection behind a mutex serves the process (SQLite writes one transaction at a time anyway); WAL
//! mode lets readers of other processes run beside a writer, and the busy timeout makes a second process
//! writing the same file wait for its turn instead of failing. Every write opens with `BEGIN IMMEDIATE`,
//! which takes the write lock at once, so two writers never deadlock upgrading from a read.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use serde_json::Value;

use super::{Conversation, ConversationItem, Order, Owner, StoreBackend, StoreError, StoredResponse};

/// How long a write waits for another process holding the file's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The schema, one entry per version: migration `i` takes the database from version `i` to `i + 1`.
/// Append only; a shipped migration never changes.
pub(super) const MIGRATIONS: &[&str] = &[
    "
    CREATE TABLE responses (
        id TEXT PRIMARY KEY,
        created_at INTEGER NOT NULL,
        model TEXT NOT NULL,
        previous_response_id TEXT,
        conversation_id TEXT,
        input_items TEXT NOT NULL,
        response TEXT NOT NULL
    );
    CREATE TABLE conversations (
        id TEXT PRIMARY KEY,
        created_at INTEGER NOT NULL,
        metadata TEXT NOT NULL,
        -- The position the next item gets: positions are never reused, even after deletes.
        next_position INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE conversation_items (
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        id TEXT NOT NULL,
        item TEXT NOT NULL,
        PRIMARY KEY (conversation_id, position)
    );
    CREATE INDEX conversation_items_by_id ON conversation_items (conversation_id, id);
",
    "
    -- The tenant (API key hash) a row belongs to; NULL: the keyless tenant, and every row stored before.
    ALTER TABLE responses ADD COLUMN owner TEXT;
    ALTER TABLE conversations ADD COLUMN owner TEXT;
",
];

pub struct SqliteStore {
    connection: Mutex<Connection>,
}

/// The `id` of each item (every stored item has one; the store does not invent ids). Shared with the
/// PostgreSQL store.
pub(super) fn item_ids(items: &[Value]) -> Result<Vec<String>, StoreError> {
    items
        .iter()
        .map(|item| {
            item.get("id")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| StoreError::Backend("a conversation item without an id".into()))
        })
        .collect()
}

fn backend(error: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(error.to_string())
}

fn to_json(value: &Value) -> String {
    value.to_string()
}

fn from_json(text: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text).map_err(|e| backend(format!("a stored JSON value does not parse: {e}")))
}

impl SqliteStore {
    /// Opens (creating when absent) the database file and brings its schema up to date.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| backend(format!("{}: {e}", parent.display())))?;
        }
        let mut connection = Connection::open(path).map_err(|e| backend(format!("opening {}: {e}", path.display())))?;
        connection.busy_timeout(BUSY_TIMEOUT).map_err(backend)?;
        // `journal_mode` answers with the mode now in force; a file system without shared memory stays
        // in the rollback journal, which is slower but just as correct.
        let _mode: String = connection
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(backend)?;
        connection
            .execute_batch("PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL;")
            .map_err(backend)?;
        migrate(&mut connection).map_err(|e| match e {
            StoreError::Backend(message) => backend(format!("{}: {message}", path.display())),
            other => other,
        })?;
        Ok(Self {
            connection: Mutex::new(connection),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic inside a transaction rolled it back when the Transaction dropped: the connection is fine.
        self.connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `body` in one write transaction, committed when it returns Ok.
    fn write<T>(&self, body: impl FnOnce(&Transaction) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut connection = self.lock();
        let tx = connection
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(backend)?;
        let value = body(&tx)?;
        tx.commit().map_err(backend)?;
        Ok(value)
    }

    /// Runs `body` in one read transaction (a consistent snapshot across its statements).
    fn read<T>(&self, body: impl FnOnce(&Transaction) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut connection = self.lock();
        let tx = connection
            .transaction_with_behavior(TransactionBehavior::Deferred)
            .map_err(backend)?;
        body(&tx)
    }
}

/// Applies the migrations the database has not seen, in order, in one transaction.
fn migrate(connection: &mut Connection) -> Result<(), StoreError> {
    let tx = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(backend)?;
    tx.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        .map_err(backend)?;
    let current: i64 = tx
        .query_row("SELECT COALESCE(MAX(version), 0) FROM schema_version", [], |row| {
            row.get(0)
        })
        .map_err(backend)?;
    let known = MIGRATIONS.len() as i64;
    if current > known {
        return Err(backend(format!(
            "the database's schema is version {current}, newer than this gateway knows ({known}): \
             run the newer gateway, or point this one at another database"
        )));
    }
    for (version, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        tx.execute_batch(sql)
            .map_err(|e| backend(format!("schema migration {}: {e}", version + 1)))?;
    }
    if current < known {
        tx.execute("DELETE FROM schema_version", []).map_err(backend)?;
        tx.execute("INSERT INTO schema_version (version) VALUES (?1)", [known])
            .map_err(backend)?;
    }
    tx.commit().map_err(backend)
}

/// Appends items at the conversation's next positions; `ConversationNotFound` when the owner has no such
/// conversation. (`IS` compares NULLs as equal: the keyless tenant's rows match a NULL owner.)
fn append(
    tx: &Transaction,
    owner: Owner<'_>,
    conversation_id: &str,
    items: &[Value],
) -> Result<Vec<ConversationItem>, StoreError> {
    let ids = item_ids(items)?;
    let start: Option<i64> = tx
        .query_row(
            "UPDATE conversations SET next_position = next_position + ?2 WHERE id = ?1 AND owner IS ?3 \
             RETURNING next_position - ?2",
            params![conversation_id, items.len() as i64, owner],
            |row| row.get(0),
        )
        .optional()
        .map_err(backend)?;
    let start = start.ok_or_else(|| StoreError::ConversationNotFound(conversation_id.to_owned()))?;
    let mut insert = tx
        .prepare_cached("INSERT INTO conversation_items (conversation_id, position, id, item) VALUES (?1, ?2, ?3, ?4)")
        .map_err(backend)?;
    let mut added = Vec::with_capacity(items.len());
    for (offset, (id, item)) in ids.into_iter().zip(items).enumerate() {
        let position = start + offset as i64;
        insert
            .execute(params![conversation_id, position, id, to_json(item)])
            .map_err(backend)?;
        added.push(ConversationItem {
            id,
            conversation_id: conversation_id.to_owned(),
            position,
            item: item.clone(),
        });
    }
    Ok(added)
}

fn conversation_exists(tx: &Transaction, owner: Owner<'_>, id: &str) -> Result<bool, StoreError> {
    tx.query_row(
        "SELECT 1 FROM conversations WHERE id = ?1 AND owner IS ?2",
        params![id, owner],
        |_| Ok(()),
    )
    .optional()
    .map(|found| found.is_some())
    .map_err(backend)
}

fn require_conversation(tx: &Transaction, owner: Owner<'_>, id: &str) -> Result<(), StoreError> {
    if conversation_exists(tx, owner, id)? {
        Ok(())
    } else {
        Err(StoreError::ConversationNotFound(id.to_owned()))
    }
}

fn item_row(row: &rusqlite::Row) -> rusqlite::Result<(String, i64, String)> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
}

fn to_item(conversation_id: &str, (id, position, item): (String, i64, String)) -> Result<ConversationItem, StoreError> {
    Ok(ConversationItem {
        id,
        conversation_id: conversation_id.to_owned(),
        position,
        item: from_json(&item)?,
    })
}

impl StoreBackend for SqliteStore {
    fn put_response(
        &self,
        owner: Owner<'_>,
        response: &StoredResponse,
        conversation_items: &[Value],
    ) -> Result<(), StoreError> {
        self.write(|tx| {
            let inserted = tx
                .execute(
                    "INSERT INTO responses (id, created_at, model, previous_response_id, conversation_id, \
                     input_items, response, owner) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
                     ON CONFLICT (id) DO NOTHING",
                    params![
                        response.id,
                        response.created_at,
                        response.model,
                        response.previous_response_id,
                        response.conversation_id,
                        to_json(&Value::Array(response.input_items.clone())),
                        to_json(&response.response),
                        owner,
                    ],
                )
                .map_err(backend)?;
            if inserted == 0 {
                return Err(StoreError::Duplicate(response.id.clone()));
            }
            if let Some(conversation_id) = &response.conversation_id {
                append(tx, owner, conversation_id, conversation_items)?;
            }
            Ok(())
        })
    }

    fn get_response(&self, owner: Owner<'_>, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        self.read(|tx| {
            let row = tx
                .query_row(
                    "SELECT created_at, model, previous_response_id, conversation_id, input_items, response \
                     FROM responses WHERE id = ?1 AND owner IS ?2",
                    params![id, owner],
                    |row| {
                        Ok((
                            row.get::<_, i64>(0)?,
                            row.get::<_, String>(1)?,
                            row.get::<_, Option<String>>(2)?,
                            row.get::<_, Option<String>>(3)?,
                            row.get::<_, String>(4)?,
                            row.get::<_, String>(5)?,
                        ))
                    },
                )
                .optional()
                .map_err(backend)?;
            let Some((created_at, model, previous_response_id, conversation_id, input_items, response)) = row else {
                return Ok(None);
            };
            let input_items = match from_json(&input_items)? {
                Value::Array(items) => items,
                other => return Err(backend(format!("stored input items are not a list: {other}"))),
            };
            Ok(Some(StoredResponse {
                id: id.to_owned(),
                created_at,
                model,
                previous_response_id,
                conversation_id,
                input_items,
                response: from_json(&response)?,
            }))
        })
    }

    fn delete_response(&self, owner: Owner<'_>, id: &str) -> Result<bool, StoreError> {
        self.write(|tx| {
            tx.execute(
                "DELETE FROM responses WHERE id = ?1 AND owner IS ?2",
                params![id, owner],
            )
            .map(|deleted| deleted > 0)
            .map_err(backend)
        })
    }

    fn create_conversation(
        &self,
        owner: Owner<'_>,
        conversation: &Conversation,
        items: &[Value],
    ) -> Result<(), StoreError> {
        self.write(|tx| {
            let inserted = tx
                .execute(
                    "INSERT INTO conversations (id, created_at, metadata, owner) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (id) DO NOTHING",
                    params![
                        conversation.id,
                        conversation.created_at,
                        to_json(&conversation.metadata),
                        owner
                    ],
                )
                .map_err(backend)?;
            if inserted == 0 {
                return Err(StoreError::Duplicate(conversation.id.clone()));
            }
            append(tx, owner, &conversation.id, items).map(drop)
        })
    }

    fn get_conversation(&self, owner: Owner<'_>, id: &str) -> Result<Option<Conversation>, StoreError> {
        self.read(|tx| {
            let row = tx
                .query_row(
                    "SELECT created_at, metadata FROM conversations WHERE id = ?1 AND owner IS ?2",
                    params![id, owner],
                    |row| Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?)),
                )
                .optional()
                .map_err(backend)?;
            row.map(|(created_at, metadata)| {
                Ok(Conversation {
                    id: id.to_owned(),
                    created_at,
                    metadata: from_json(&metadata)?,
                })
            })
            .transpose()
        })
    }

    fn update_conversation(&self, owner: Owner<'_>, id: &str, metadata: &Value) -> Result<bool, StoreError> {
        self.write(|tx| {
            tx.execute(
                "UPDATE conversations SET metadata = ?2 WHERE id = ?1 AND owner IS ?3",
                params![id, to_json(metadata), owner],
            )
            .map(|updated| updated > 0)
            .map_err(backend)
        })
    }

    fn delete_conversation(&self, owner: Owner<'_>, id: &str) -> Result<bool, StoreError> {
        // The items go with it (ON DELETE CASCADE).
        self.write(|tx| {
            tx.execute(
                "DELETE FROM conversations WHERE id = ?1 AND owner IS ?2",
                params![id, owner],
            )
            .map(|deleted| deleted > 0)
            .map_err(backend)
        })
    }

    fn add_items(
        &self,
        owner: Owner<'_>,
        conversation_id: &str,
        items: &[Value],
    ) -> Result<Vec<ConversationItem>, StoreError> {
        self.write(|tx| append(tx, owner, conversation_id, items))
    }

    fn list_items(
        &self,
        owner: Owner<'_>,
        conversation_id: &str,
        after: Option<&str>,
        limit: usize,
        order: Order,
    ) -> Result<Vec<ConversationItem>, StoreError> {
        self.read(|tx| {
            require_conversation(tx, owner, conversation_id)?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            // The cursor is the position of the item named `after` (the first one met in this order); an
            // unknown cursor lists nothing.
            let (cursor_sql, list_sql) = match order {
                Order::Asc => (
                    "SELECT MIN(position) FROM conversation_items WHERE conversation_id = ?1 AND id = ?2",
                    "SELECT id, position, item FROM conversation_items WHERE conversation_id = ?1 \
                     AND position > ?2 ORDER BY position ASC LIMIT ?3",
                ),
                Order::Desc => (
                    "SELECT MAX(position) FROM conversation_items WHERE conversation_id = ?1 AND id = ?2",
                    "SELECT id, position, item FROM conversation_items WHERE conversation_id = ?1 \
                     AND position < ?2 ORDER BY position DESC LIMIT ?3",
                ),
            };
            let bound = match after {
                None => match order {
                    Order::Asc => -1,
                    Order::Desc => i64::MAX,
                },
                Some(after) => {
                    let position: Option<i64> = tx
                        .query_row(cursor_sql, params![conversation_id, after], |row| row.get(0))
                        .map_err(backend)?;
                    match position {
                        Some(position) => position,
                        None => return Ok(Vec::new()),
                    }
                }
            };
            let mut statement = tx.prepare_cached(list_sql).map_err(backend)?;
            let rows = statement
                .query_map(params![conversation_id, bound, limit], item_row)
                .map_err(backend)?;
            rows.map(|row| to_item(conversation_id, row.map_err(backend)?))
                .collect()
        })
    }

    fn get_item(
        &self,
        owner: Owner<'_>,
        conversation_id: &str,
        item_id: &str,
    ) -> Result<Option<ConversationItem>, StoreError> {
        self.read(|tx| {
            require_conversation(tx, owner, conversation_id)?;
            let row = tx
                .query_row(
                    "SELECT id, position, item FROM conversation_items WHERE conversation_id = ?1 AND id = ?2 \
                     ORDER BY position LIMIT 1",
                    params![conversation_id, item_id],
                    item_row,
                )
                .optional()
                .map_err(backend)?;
            row.map(|row| to_item(conversation_id, row)).transpose()
        })
    }

    fn delete_item(&self, owner: Owner<'_>, conversation_id: &str, item_id: &str) -> Result<bool, StoreError> {
        self.write(|tx| {
            require_conversation(tx, owner, conversation_id)?;
            tx.execute(
                "DELETE FROM conversation_items WHERE conversation_id = ?1 AND id = ?2",
                params![conversation_id, item_id],
            )
            .map(|deleted| deleted > 0)
            .map_err(backend)
        })
    }
}
