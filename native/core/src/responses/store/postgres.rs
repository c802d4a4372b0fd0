//! The PostgreSQL store (`postgres://…`, `postgresql://…`): one database shared by several gateway replicas.
//!
//! The sync `postgres` client drives each connection on its own small current-thread runtime, so the
//! methods work from a `spawn_blocking` thread of the server's runtime (a nested `block_on` on a runtime
//! worker would panic; the blocking pool is not one). A small pool keeps a few connections; one that
//! closed (server restart, network) is dropped, and a transaction whose `BEGIN` fails is retried once on a
//! fresh connection, which is safe because nothing of it ran yet.
//!
//! Items and response objects are `json` columns, not `jsonb`: `json` keeps the text as written, so a read
//! gives back the object with its keys in the order they were answered (nothing queries inside them).
//! Appends lock the conversation's row (`UPDATE … RETURNING next_position`), so concurrent writers of one
//! conversation take positions one after another: unique and without gaps.

use std::str::FromStr;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use postgres::{Client, Config, IsolationLevel, NoTls, Transaction};
use serde_json::Value;

use super::sqlite::item_ids;
use super::{Conversation, ConversationItem, Order, Owner, StoreBackend, StoreError, StoredResponse};

/// Connections the pool holds at most; callers beyond wait for one to come back.
const POOL_SIZE: usize = 8;
/// How long a caller waits for a pooled connection before the store answers a backend error.
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Serialises schema migrations of replicas starting together (any constant all replicas agree on).
const MIGRATION_LOCK: i64 = 0x6578_7470_7263; // "extprc"

/// The schema, one entry per version: migration `i` takes the database from version `i` to `i + 1`.
/// Append only; a shipped migration never changes.
pub(super) const MIGRATIONS: &[&str] = &[
    "
    CREATE TABLE responses (
        id TEXT PRIMARY KEY,
        created_at BIGINT NOT NULL,
        model TEXT NOT NULL,
        previous_response_id TEXT,
        conversation_id TEXT,
        input_items JSON NOT NULL,
        response JSON NOT NULL
    );
    CREATE TABLE conversations (
        id TEXT PRIMARY KEY,
        created_at BIGINT NOT NULL,
        metadata JSON NOT NULL,
        -- The position the next item gets: positions are never reused, even after deletes.
        next_position BIGINT NOT NULL DEFAULT 0
    );
    CREATE TABLE conversation_items (
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        position BIGINT NOT NULL,
        id TEXT NOT NULL,
        item JSON NOT NULL,
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

fn backend(error: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(error.to_string())
}

/// The message of a client error with its server-side detail (the bare Display is often just "db error").
fn describe(error: &postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => error.to_string(),
    }
}

fn pg(error: postgres::Error) -> StoreError {
    StoreError::Backend(describe(&error))
}

pub struct PostgresStore {
    config: Config,
    pool: Mutex<Pool>,
    returned: Condvar,
}

#[derive(Default)]
struct Pool {
    idle: Vec<Client>,
    /// Connections open, idle or checked out.
    open: usize,
}

/// A checked-out connection; goes back to the pool on drop unless it closed.
struct Pooled<'a> {
    store: &'a PostgresStore,
    client: Option<Client>,
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        let client = self.client.take();
        let mut pool = self.store.lock();
        match client {
            Some(client) if !client.is_closed() => pool.idle.push(client),
            _ => pool.open -= 1,
        }
        drop(pool);
        self.store.returned.notify_one();
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        // Each client owns a runtime, and dropping a runtime on an async worker thread panics; the store's
        // last reference may well go away on one, so the connections close on a thread of their own.
        let idle = std::mem::take(&mut self.lock().idle);
        if !idle.is_empty() {
            let _ = std::thread::Builder::new()
                .name("pg-store-close".into())
                .spawn(move || drop(idle));
        }
    }
}

impl PostgresStore {
    /// Connects (a libpq-style URL: `postgres://user:password@host:port/db?…`) and brings the schema up
    /// to date.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let mut config = Config::from_str(url).map_err(|e| backend(format!("the PostgreSQL URL: {e}")))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config.application_name("extproc");
        let store = Self {
            config,
            pool: Mutex::new(Pool::default()),
            returned: Condvar::new(),
        };
        store.transaction(false, migrate)?;
        Ok(store)
    }

    fn lock(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn connect(&self) -> Result<Client, StoreError> {
        self.config
            .connect(NoTls)
            .map_err(|e| backend(format!("connecting to PostgreSQL: {}", describe(&e))))
    }

    fn checkout(&self) -> Result<Pooled<'_>, StoreError> {
        let mut pool = self.lock();
        loop {
            if let Some(client) = pool.idle.pop() {
                if client.is_closed() {
                    pool.open -= 1;
                    continue;
                }
                return Ok(Pooled {
                    store: self,
                    client: Some(client),
                });
            }
            if pool.open < POOL_SIZE {
                pool.open += 1;
                drop(pool);
                // A failed connect gives its slot back through the guard's drop.
                let mut pooled = Pooled {
                    store: self,
                    client: None,
                };
                pooled.client = Some(self.connect()?);
                return Ok(pooled);
            }
            let (next, timeout) = self
                .returned
                .wait_timeout(pool, CHECKOUT_TIMEOUT)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            pool = next;
            if timeout.timed_out() && pool.idle.is_empty() && pool.open >= POOL_SIZE {
                return Err(backend("no PostgreSQL connection came free in time"));
            }
        }
    }

    /// Closes every idle connection: after a connection failed, the others (same server) likely did too.
    fn drop_idle(&self) {
        let idle = {
            let mut pool = self.lock();
            pool.open -= pool.idle.len();
            std::mem::take(&mut pool.idle)
        };
        drop(idle);
    }

    /// Runs `body` in one transaction, committed when it returns Ok. Reads run read-only at REPEATABLE
    /// READ, so their statements see one snapshot.
    fn transaction<T>(
        &self,
        read_only: bool,
        body: impl Fn(&mut Transaction) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        for attempt in 0..2 {
            let mut pooled = self.checkout()?;
            // The block ends the transaction's borrow of the connection before the retry path drops it.
            let error = {
                let client = pooled.client.as_mut().expect("a checked-out connection");
                let begin = if read_only {
                    client
                        .build_transaction()
                        .isolation_level(IsolationLevel::RepeatableRead)
                        .read_only(true)
                        .start()
                } else {
                    client.transaction()
                };
                match begin {
                    Ok(mut tx) => {
                        let value = body(&mut tx)?;
                        tx.commit().map_err(pg)?;
                        return Ok(value);
                    }
                    Err(error) => error,
                }
            };
            if attempt > 0 {
                return Err(pg(error));
            }
            // Nothing of the transaction ran: a stale connection (the server restarted) is replaced and
            // the whole transaction tried once more.
            drop(pooled);
            self.drop_idle();
        }
        unreachable!("the second attempt returns")
    }
}

/// Applies the migrations the database has not seen, in order, inside the caller's transaction.
fn migrate(tx: &mut Transaction) -> Result<(), StoreError> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(pg)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
        .map_err(pg)?;
    let current: i64 = tx
        .query_one("SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_version", &[])
        .map_err(pg)?
        .get(0);
    let known = MIGRATIONS.len() as i64;
    if current > known {
        return Err(backend(format!(
            "the database's schema is version {current}, newer than this gateway knows ({known}): \
             run the newer gateway, or point this one at another database"
        )));
    }
    for (version, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        tx.batch_execute(sql)
            .map_err(|e| backend(format!("schema migration {}: {}", version + 1, describe(&e))))?;
    }
    if current < known {
        tx.execute("DELETE FROM schema_version", &[]).map_err(pg)?;
        tx.execute("INSERT INTO schema_version (version) VALUES ($1)", &[&known])
            .map_err(pg)?;
    }
    Ok(())
}

/// Appends items at the conversation's next positions; `ConversationNotFound` when the owner has no such
/// conversation. (`IS NOT DISTINCT FROM` compares NULLs as equal: the keyless tenant's rows match a NULL
/// owner.)
fn append(
    tx: &mut Transaction,
    owner: Owner<'_>,
    conversation_id: &str,
    items: &[Value],
) -> Result<Vec<ConversationItem>, StoreError> {
    let ids = item_ids(items)?;
    let count = items.len() as i64;
    let start: i64 = tx
        .query_opt(
            "UPDATE conversations SET next_position = next_position + $2 \
             WHERE id = $1 AND owner IS NOT DISTINCT FROM $3 RETURNING next_position - $2",
            &[&conversation_id, &count, &owner],
        )
        .map_err(pg)?
        .ok_or_else(|| StoreError::ConversationNotFound(conversation_id.to_owned()))?
        .get(0);
    let insert = tx
        .prepare("INSERT INTO conversation_items (conversation_id, position, id, item) VALUES ($1, $2, $3, $4)")
        .map_err(pg)?;
    let mut added = Vec::with_capacity(items.len());
    for (offset, (id, item)) in ids.into_iter().zip(items).enumerate() {
        let position = start + offset as i64;
        tx.execute(
            &insert,
            &[&conversation_id, &position, &id, &postgres::types::Json(item)],
        )
        .map_err(pg)?;
        added.push(ConversationItem {
            id,
            conversation_id: conversation_id.to_owned(),
            position,
            item: item.clone(),
        });
    }
    Ok(added)
}

fn require_conversation(tx: &mut Transaction, owner: Owner<'_>, id: &str) -> Result<(), StoreError> {
    match tx
        .query_opt(
            "SELECT 1 FROM conversations WHERE id = $1 AND owner IS NOT DISTINCT FROM $2",
            &[&id, &owner],
        )
        .map_err(pg)?
    {
        Some(_) => Ok(()),
        None => Err(StoreError::ConversationNotFound(id.to_owned())),
    }
}

fn to_item(conversation_id: &str, row: &postgres::Row) -> ConversationItem {
    ConversationItem {
        id: row.get(0),
        conversation_id: conversation_id.to_owned(),
        position: row.get(1),
        item: row.get(2),
    }
}

impl StoreBackend for PostgresStore {
    fn put_response(
        &self,
        owner: Owner<'_>,
        response: &StoredResponse,
        conversation_items: &[Value],
    ) -> Result<(), StoreError> {
        let input_items = Value::Array(response.input_items.clone());
        self.transaction(false, |tx| {
            let inserted = tx
                .execute(
                    "INSERT INTO responses (id, created_at, model, previous_response_id, conversation_id, \
                     input_items, response, owner) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                     ON CONFLICT (id) DO NOTHING",
                    &[
                        &response.id,
                        &response.created_at,
                        &response.model,
                        &response.previous_response_id,
                        &response.conversation_id,
                        &input_items,
                        &response.response,
                        &owner,
                    ],
                )
                .map_err(pg)?;
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
        self.transaction(true, |tx| {
            let Some(row) = tx
                .query_opt(
                    "SELECT created_at, model, previous_response_id, conversation_id, input_items, response \
                     FROM responses WHERE id = $1 AND owner IS NOT DISTINCT FROM $2",
                    &[&id, &owner],
                )
                .map_err(pg)?
            else {
                return Ok(None);
            };
            let input_items = match row.get::<_, Value>(4) {
                Value::Array(items) => items,
                other => return Err(backend(format!("stored input items are not a list: {other}"))),
            };
            Ok(Some(StoredResponse {
                id: id.to_owned(),
                created_at: row.get(0),
                model: row.get(1),
                previous_response_id: row.get(2),
                conversation_id: row.get(3),
                input_items,
                response: row.get(5),
            }))
        })
    }

    fn delete_response(&self, owner: Owner<'_>, id: &str) -> Result<bool, StoreError> {
        self.transaction(false, |tx| {
            tx.execute(
                "DELETE FROM responses WHERE id = $1 AND owner IS NOT DISTINCT FROM $2",
                &[&id, &owner],
            )
            .map(|deleted| deleted > 0)
            .map_err(pg)
        })
    }

    fn create_conversation(
        &self,
        owner: Owner<'_>,
        conversation: &Conversation,
        items: &[Value],
    ) -> Result<(), StoreError> {
        self.transaction(false, |tx| {
            let inserted = tx
                .execute(
                    "INSERT INTO conversations (id, created_at, metadata, owner) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (id) DO NOTHING",
                    &[
                        &conversation.id,
                        &conversation.created_at,
                        &conversation.metadata,
                        &owner,
                    ],
                )
                .map_err(pg)?;
            if inserted == 0 {
                return Err(StoreError::Duplicate(conversation.id.clone()));
            }
            append(tx, owner, &conversation.id, items).map(drop)
        })
    }

    fn get_conversation(&self, owner: Owner<'_>, id: &str) -> Result<Option<Conversation>, StoreError> {
        self.transaction(true, |tx| {
            Ok(tx
                .query_opt(
                    "SELECT created_at, metadata FROM conversations WHERE id = $1 \
                     AND owner IS NOT DISTINCT FROM $2",
                    &[&id, &owner],
                )
                .map_err(pg)?
                .map(|row| Conversation {
                    id: id.to_owned(),
                    created_at: row.get(0),
                    metadata: row.get(1),
                }))
        })
    }

    fn update_conversation(&self, owner: Owner<'_>, id: &str, metadata: &Value) -> Result<bool, StoreError> {
        self.transaction(false, |tx| {
            tx.execute(
                "UPDATE conversations SET metadata = $2 WHERE id = $1 AND owner IS NOT DISTINCT FROM $3",
                &[&id, metadata, &owner],
            )
            .map(|updated| updated > 0)
            .map_err(pg)
        })
    }

    fn delete_conversation(&self, owner: Owner<'_>, id: &str) -> Result<bool, StoreError> {
        // The items go with it (ON DELETE CASCADE).
        self.transaction(false, |tx| {
            tx.execute(
                "DELETE FROM conversations WHERE id = $1 AND owner IS NOT DISTINCT FROM $2",
                &[&id, &owner],
            )
            .map(|deleted| deleted > 0)
            .map_err(pg)
        })
    }

    fn add_items(
        &self,
        owner: Owner<'_>,
        conversation_id: &str,
        items: &[Value],
    ) -> Result<Vec<ConversationItem>, StoreError> {
        self.transaction(false, |tx| append(tx, owner, conversation_id, items))
    }

    fn list_items(
        &self,
        owner: Owner<'_>,
        conversation_id: &str,
        after: Option<&str>,
        limit: usize,
        order: Order,
    ) -> Result<Vec<ConversationItem>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.transaction(true, |tx| {
            require_conversation(tx, owner, conversation_id)?;
            // The cursor is the position of the item named `after` (the first one met in this order); an
            // unknown cursor lists nothing.
            let (cursor_sql, list_sql, unbounded) = match order {
                Order::Asc => (
                    "SELECT MIN(position) FROM conversation_items WHERE conversation_id = $1 AND id = $2",
                    "SELECT id, position, item FROM conversation_items WHERE conversation_id = $1 \
                     AND position > $2 ORDER BY position ASC LIMIT $3",
                    -1,
                ),
                Order::Desc => (
                    "SELECT MAX(position) FROM conversation_items WHERE conversation_id = $1 AND id = $2",
                    "SELECT id, position, item FROM conversation_items WHERE conversation_id = $1 \
                     AND position < $2 ORDER BY position DESC LIMIT $3",
                    i64::MAX,
                ),
            };
            let bound = match after {
                None => unbounded,
                Some(after) => {
                    let position: Option<i64> = tx
                        .query_one(cursor_sql, &[&conversation_id, &after])
                        .map_err(pg)?
                        .get(0);
                    match position {
                        Some(position) => position,
                        None => return Ok(Vec::new()),
                    }
                }
            };
            Ok(tx
                .query(list_sql, &[&conversation_id, &bound, &limit])
                .map_err(pg)?
                .iter()
                .map(|row| to_item(conversation_id, row))
                .collect())
        })
    }

    fn get_item(
        &self,
        owner: Owner<'_>,
        conversation_id: &str,
        item_id: &str,
    ) -> Result<Option<ConversationItem>, StoreError> {
        self.transaction(true, |tx| {
            require_conversation(tx, owner, conversation_id)?;
            Ok(tx
                .query_opt(
                    "SELECT id, position, item FROM conversation_items WHERE conversation_id = $1 AND id = $2 \
                     ORDER BY position LIMIT 1",
                    &[&conversation_id, &item_id],
                )
                .map_err(pg)?
                .map(|row| to_item(conversation_id, &row)))
        })
    }

    fn delete_item(&self, owner: Owner<'_>, conversation_id: &str, item_id: &str) -> Result<bool, StoreError> {
        self.transaction(false, |tx| {
            require_conversation(tx, owner, conversation_id)?;
            tx.execute(
                "DELETE FROM conversation_items WHERE conversation_id = $1 AND id = $2",
                &[&conversation_id, &item_id],
            )
            .map(|deleted| deleted > 0)
            .map_err(pg)
        })
    }
}
