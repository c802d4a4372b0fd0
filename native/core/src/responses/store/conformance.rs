//! One behaviour suite every store passes (memory, SQLite, PostgreSQL): what the API relies on, checked the
//! same way against each backend (one tenant's view, then tenants side by side), plus what only the
//! persistent ones promise (a reopen reads what was written; a schema newer than the code is refused;
//! rows stored before owners were recorded belong to the keyless tenant).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};

use super::pg_cluster::PgCluster;
use super::postgres::MIGRATIONS as POSTGRES_MIGRATIONS;
use super::sqlite::MIGRATIONS as SQLITE_MIGRATIONS;
use super::{
    open, Conversation, ConversationItem, MemoryStore, Order, PostgresStore, ResponseStore, SqliteStore, StoreBackend,
    StoreError, StoredResponse, TenantStore,
};

/// The tenant the single-tenant checks run as (an API key's owner hash, as the gateway stores it).
const OWNER: &str = "owner-of-key-a";

/// `backend` as `owner` sees it.
fn view(backend: &Arc<dyn StoreBackend>, owner: Option<&str>) -> TenantStore {
    TenantStore::new(backend.clone(), owner.map(str::to_owned))
}

/// A new backend as `OWNER` sees it.
fn as_owner(backend: impl StoreBackend + 'static) -> TenantStore {
    view(&(Arc::new(backend) as Arc<dyn StoreBackend>), Some(OWNER))
}

fn response(id: &str, conversation_id: Option<&str>) -> StoredResponse {
    StoredResponse {
        id: id.into(),
        created_at: 1_700_000_000,
        model: "m".into(),
        previous_response_id: Some("resp_before".into()),
        conversation_id: conversation_id.map(str::to_owned),
        input_items: vec![item(&format!("{id}_in"))],
        // Keys out of alphabetical order: a read must give them back as written.
        response: json!({"id": id, "object": "response", "status": "completed",
                         "output": [{"type": "message", "content": [{"type": "output_text", "text": "hé ☃"}]}],
                         "usage": {"total_tokens": 7, "input_tokens": 5}, "metadata": {"z": "1", "a": "2"}}),
    }
}

fn item(id: &str) -> Value {
    json!({"type": "message", "id": id, "role": "user", "content": [{"type": "input_text", "text": id}]})
}

fn conversation(id: &str) -> Conversation {
    Conversation {
        id: id.into(),
        created_at: 1_700_000_001,
        metadata: json!({"topic": "t", "a": "b"}),
    }
}

fn ids(items: &[ConversationItem]) -> Vec<&str> {
    items.iter().map(|item| item.id.as_str()).collect()
}

fn positions(items: &[ConversationItem]) -> Vec<i64> {
    items.iter().map(|item| item.position).collect()
}

fn not_found<T: std::fmt::Debug>(result: Result<T, StoreError>, id: &str) {
    match result {
        Err(StoreError::ConversationNotFound(missing)) => assert_eq!(missing, id),
        other => panic!("expected ConversationNotFound({id}), got {other:?}"),
    }
}

/// Every method's behaviour, on a backend that may already hold other data (ids are prefixed): as one
/// tenant sees it, then across tenants.
pub fn conforms(backend: &Arc<dyn StoreBackend>) {
    let store = &view(backend, Some(OWNER));
    responses(store);
    conversations(store);
    items_and_cursors(store);
    missing_conversations(store);
    duplicates_change_nothing(store);
    a_response_into_a_deleted_conversation_stores_nothing(store);
    concurrent_writers(&[store]);
    tenants_see_only_their_own(backend);
}

/// What one tenant stored is absent for every other (another key, or the keyless tenant): not found, not
/// deleted, not changed, not appended to; its owner still sees all of it.
fn tenants_see_only_their_own(backend: &Arc<dyn StoreBackend>) {
    let (a, b, keyless) = (
        view(backend, Some("tenant-a")),
        view(backend, Some("tenant-b")),
        view(backend, None),
    );
    a.create_conversation(&conversation("conv_o1"), &[item("o0")]).unwrap();
    let stored = response("resp_o1", Some("conv_o1"));
    a.put_response(&stored, &[item("o1")]).unwrap();
    keyless.put_response(&response("resp_o2", None), &[]).unwrap();
    for other in [&b, &keyless] {
        assert_eq!(other.get_response("resp_o1").unwrap(), None);
        assert!(!other.delete_response("resp_o1").unwrap());
        assert_eq!(other.get_conversation("conv_o1").unwrap(), None);
        assert!(!other.update_conversation("conv_o1", &json!({"x": "y"})).unwrap());
        assert!(!other.delete_conversation("conv_o1").unwrap());
        not_found(other.add_items("conv_o1", &[item("ox")]), "conv_o1");
        not_found(other.list_items("conv_o1", None, 10, Order::Asc), "conv_o1");
        not_found(other.get_item("conv_o1", "o0"), "conv_o1");
        not_found(other.delete_item("conv_o1", "o0"), "conv_o1");
        // A response into another tenant's conversation is not stored and appends nothing.
        not_found(
            other.put_response(&response("resp_ox", Some("conv_o1")), &[item("ox")]),
            "conv_o1",
        );
        assert_eq!(other.get_response("resp_ox").unwrap(), None);
    }
    assert_eq!(a.get_response("resp_o1").unwrap(), Some(stored));
    assert_eq!(a.get_conversation("conv_o1").unwrap(), Some(conversation("conv_o1")));
    let listed = a.list_items("conv_o1", None, 10, Order::Asc).unwrap();
    assert_eq!(ids(&listed), ["o0", "o1"]);
    assert_eq!(positions(&listed), [0, 1]);
    // The keyless tenant is a tenant like any other: a key does not see its rows either.
    assert_eq!(a.get_response("resp_o2").unwrap(), None);
    assert!(keyless.get_response("resp_o2").unwrap().is_some());
    // The owner changes and deletes its own.
    assert_eq!(positions(&a.add_items("conv_o1", &[item("o2")]).unwrap()), [2]);
    assert!(a.delete_item("conv_o1", "o0").unwrap());
    assert!(a.delete_conversation("conv_o1").unwrap());
    assert!(a.delete_response("resp_o1").unwrap());
    assert!(keyless.delete_response("resp_o2").unwrap());
}

/// Rows a schema-1 gateway wrote (no owner column), in SQL both SQLite and PostgreSQL take.
const SCHEMA_1_ROWS: &str = r#"
    INSERT INTO responses (id, created_at, model, previous_response_id, conversation_id, input_items, response)
        VALUES ('resp_v1', 1, 'm', NULL, 'conv_v1', '[]', '{"id": "resp_v1"}');
    INSERT INTO conversations (id, created_at, metadata, next_position) VALUES ('conv_v1', 1, '{}', 1);
    INSERT INTO conversation_items (conversation_id, position, id, item)
        VALUES ('conv_v1', 0, 'v0', '{"id": "v0"}');
"#;

/// The schema-1 database with `SCHEMA_1_ROWS`, as `migrations[0]` built it.
fn schema_1_database(first_migration: &str) -> String {
    format!(
        "{first_migration}; CREATE TABLE schema_version (version BIGINT NOT NULL); \
         INSERT INTO schema_version (version) VALUES (1); {SCHEMA_1_ROWS}"
    )
}

/// After the migration, `SCHEMA_1_ROWS` read as the keyless tenant's (and only as its).
fn rows_from_before_owners_are_the_keyless_tenants(backend: &Arc<dyn StoreBackend>) {
    let (keyless, keyed) = (view(backend, None), view(backend, Some(OWNER)));
    let old = keyless.get_response("resp_v1").unwrap().expect("an old row reads");
    assert_eq!(
        (old.response, old.conversation_id),
        (json!({"id": "resp_v1"}), Some("conv_v1".into()))
    );
    assert_eq!(keyed.get_response("resp_v1").unwrap(), None);
    assert_eq!(
        ids(&keyless.list_items("conv_v1", None, 10, Order::Asc).unwrap()),
        ["v0"]
    );
    not_found(keyed.list_items("conv_v1", None, 10, Order::Asc), "conv_v1");
    assert_eq!(positions(&keyless.add_items("conv_v1", &[item("v1")]).unwrap()), [1]);
}

fn responses(store: &dyn ResponseStore) {
    assert_eq!(store.get_response("resp_r1").unwrap(), None);
    let stored = response("resp_r1", None);
    store.put_response(&stored, &[]).unwrap();
    let read = store.get_response("resp_r1").unwrap().expect("stored");
    assert_eq!(read, stored);
    assert_eq!(read.response.to_string(), stored.response.to_string(), "key order kept");
    let bare = StoredResponse {
        previous_response_id: None,
        input_items: vec![],
        ..response("resp_r2", None)
    };
    store.put_response(&bare, &[]).unwrap();
    assert_eq!(store.get_response("resp_r2").unwrap(), Some(bare));
    assert!(store.delete_response("resp_r1").unwrap());
    assert_eq!(store.get_response("resp_r1").unwrap(), None);
    assert!(!store.delete_response("resp_r1").unwrap());
    assert!(
        store.get_response("resp_r2").unwrap().is_some(),
        "deleting one leaves the other"
    );
}

fn conversations(store: &dyn ResponseStore) {
    let created = conversation("conv_c1");
    store
        .create_conversation(&created, &[item("c1_0"), item("c1_1")])
        .unwrap();
    assert_eq!(store.get_conversation("conv_c1").unwrap(), Some(created.clone()));
    let listed = store.list_items("conv_c1", None, 10, Order::Asc).unwrap();
    assert_eq!(ids(&listed), ["c1_0", "c1_1"]);
    assert_eq!(listed[1].item, item("c1_1"));
    assert_eq!(listed[1].conversation_id, "conv_c1");

    assert!(store.update_conversation("conv_c1", &json!({"topic": "u"})).unwrap());
    assert_eq!(
        store.get_conversation("conv_c1").unwrap().unwrap().metadata,
        json!({"topic": "u"})
    );

    // A response in the conversation appends its items after the ones there, in the order given.
    store
        .put_response(&response("resp_c1", Some("conv_c1")), &[item("c1_2"), item("c1_3")])
        .unwrap();
    let listed = store.list_items("conv_c1", None, 10, Order::Asc).unwrap();
    assert_eq!(ids(&listed), ["c1_0", "c1_1", "c1_2", "c1_3"]);
    assert_eq!(positions(&listed), [0, 1, 2, 3]);
    // Deleting the response keeps the conversation's items; deleting the conversation keeps the response.
    assert!(store.delete_response("resp_c1").unwrap());
    assert_eq!(store.list_items("conv_c1", None, 10, Order::Asc).unwrap().len(), 4);
    store.put_response(&response("resp_c1b", Some("conv_c1")), &[]).unwrap();
    assert!(store.delete_conversation("conv_c1").unwrap());
    assert!(!store.delete_conversation("conv_c1").unwrap());
    assert_eq!(store.get_conversation("conv_c1").unwrap(), None);
    not_found(store.list_items("conv_c1", None, 10, Order::Asc), "conv_c1");
    assert!(store.get_response("resp_c1b").unwrap().is_some());
    // The id is free again, and the new conversation starts empty.
    store.create_conversation(&conversation("conv_c1"), &[]).unwrap();
    assert!(store.list_items("conv_c1", None, 10, Order::Asc).unwrap().is_empty());

    // An item without an id is refused, and the conversation it came with is not created.
    let refused = store.create_conversation(&conversation("conv_c2"), &[item("c2_0"), json!({"type": "message"})]);
    assert!(matches!(refused, Err(StoreError::Backend(_))), "{refused:?}");
    assert_eq!(store.get_conversation("conv_c2").unwrap(), None);
}

fn items_and_cursors(store: &dyn ResponseStore) {
    store
        .create_conversation(&conversation("conv_i1"), &[item("i0")])
        .unwrap();
    let added = store
        .add_items("conv_i1", &[item("i1"), item("i2"), item("i3"), item("i4")])
        .unwrap();
    assert_eq!(ids(&added), ["i1", "i2", "i3", "i4"]);
    assert_eq!(positions(&added), [1, 2, 3, 4]);
    assert_eq!(added[2].item, item("i3"));
    assert!(store.add_items("conv_i1", &[]).unwrap().is_empty());

    let list = |after: Option<&str>, limit: usize, order: Order| {
        let items = store.list_items("conv_i1", after, limit, order).unwrap();
        ids(&items).into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    assert_eq!(list(None, 2, Order::Asc), ["i0", "i1"]);
    assert_eq!(list(Some("i1"), 2, Order::Asc), ["i2", "i3"]);
    assert_eq!(list(Some("i3"), 10, Order::Asc), ["i4"]);
    assert!(list(Some("i4"), 10, Order::Asc).is_empty());
    assert_eq!(list(None, 10, Order::Desc), ["i4", "i3", "i2", "i1", "i0"]);
    assert_eq!(list(Some("i3"), 2, Order::Desc), ["i2", "i1"]);
    assert!(list(Some("i0"), 10, Order::Desc).is_empty());
    assert!(
        list(Some("nope"), 10, Order::Asc).is_empty(),
        "an unknown cursor lists nothing"
    );
    assert!(list(None, 0, Order::Asc).is_empty());

    let got = store.get_item("conv_i1", "i2").unwrap().expect("stored");
    assert_eq!((got.position, got.item), (2, item("i2")));
    assert_eq!(store.get_item("conv_i1", "nope").unwrap(), None);

    assert!(store.delete_item("conv_i1", "i2").unwrap());
    assert!(!store.delete_item("conv_i1", "i2").unwrap());
    assert_eq!(store.get_item("conv_i1", "i2").unwrap(), None);
    assert_eq!(list(None, 10, Order::Asc), ["i0", "i1", "i3", "i4"]);
    assert_eq!(
        list(Some("i1"), 1, Order::Asc),
        ["i3"],
        "a cursor steps over a deleted item"
    );
    // Positions are never reused: the next item goes after the last one ever added.
    let next = store.add_items("conv_i1", &[item("i5")]).unwrap();
    assert_eq!(positions(&next), [5]);
    // An item from another conversation is not found through this one.
    store
        .create_conversation(&conversation("conv_i2"), &[item("j0")])
        .unwrap();
    assert_eq!(store.get_item("conv_i1", "j0").unwrap(), None);
    assert!(!store.delete_item("conv_i1", "j0").unwrap());
    assert!(store.get_item("conv_i2", "j0").unwrap().is_some());
}

fn missing_conversations(store: &dyn ResponseStore) {
    assert_eq!(store.get_conversation("conv_none").unwrap(), None);
    assert!(!store.update_conversation("conv_none", &json!({})).unwrap());
    assert!(!store.delete_conversation("conv_none").unwrap());
    not_found(store.add_items("conv_none", &[item("x")]), "conv_none");
    not_found(store.list_items("conv_none", None, 10, Order::Asc), "conv_none");
    not_found(store.get_item("conv_none", "x"), "conv_none");
    not_found(store.delete_item("conv_none", "x"), "conv_none");
}

fn duplicates_change_nothing(store: &dyn ResponseStore) {
    store
        .create_conversation(&conversation("conv_d1"), &[item("d0")])
        .unwrap();
    let again = Conversation {
        metadata: json!({"other": true}),
        ..conversation("conv_d1")
    };
    assert!(matches!(
        store.create_conversation(&again, &[item("d_dup")]),
        Err(StoreError::Duplicate(id)) if id == "conv_d1"
    ));
    assert_eq!(
        store.get_conversation("conv_d1").unwrap(),
        Some(conversation("conv_d1"))
    );

    let first = response("resp_d1", Some("conv_d1"));
    store.put_response(&first, &[item("d1")]).unwrap();
    let second = StoredResponse {
        model: "other".into(),
        ..response("resp_d1", Some("conv_d1"))
    };
    assert!(matches!(
        store.put_response(&second, &[item("d2")]),
        Err(StoreError::Duplicate(id)) if id == "resp_d1"
    ));
    assert_eq!(store.get_response("resp_d1").unwrap(), Some(first));
    let listed = store.list_items("conv_d1", None, 10, Order::Asc).unwrap();
    assert_eq!(ids(&listed), ["d0", "d1"], "the refused response appended nothing");
}

fn a_response_into_a_deleted_conversation_stores_nothing(store: &dyn ResponseStore) {
    store.create_conversation(&conversation("conv_g1"), &[]).unwrap();
    assert!(store.delete_conversation("conv_g1").unwrap());
    not_found(
        store.put_response(&response("resp_g1", Some("conv_g1")), &[item("g1")]),
        "conv_g1",
    );
    assert_eq!(store.get_response("resp_g1").unwrap(), None);
    // The id was not taken by the failed attempt.
    store.put_response(&response("resp_g1", None), &[]).unwrap();
}

/// Several threads append to one conversation at once (through the given stores in turn: for SQLite and
/// PostgreSQL, separate connections of separate stores): every item lands once, positions 0..n, no gaps.
pub fn concurrent_writers(stores: &[&dyn ResponseStore]) {
    const THREADS: usize = 6;
    const ROUNDS: usize = 10;
    stores[0].create_conversation(&conversation("conv_w1"), &[]).unwrap();
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let store = stores[thread % stores.len()];
            scope.spawn(move || {
                for round in 0..ROUNDS {
                    let a = item(&format!("w{thread}_{round}_a"));
                    let b = item(&format!("w{thread}_{round}_b"));
                    if round % 2 == 0 {
                        store.add_items("conv_w1", &[a, b]).unwrap();
                    } else {
                        let id = format!("resp_w{thread}_{round}");
                        store.put_response(&response(&id, Some("conv_w1")), &[a, b]).unwrap();
                    }
                }
            });
        }
    });
    let listed = stores[0].list_items("conv_w1", None, usize::MAX, Order::Asc).unwrap();
    let expected = THREADS * ROUNDS * 2;
    assert_eq!(positions(&listed), (0..expected as i64).collect::<Vec<_>>());
    let mut seen: Vec<&str> = ids(&listed);
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), expected, "every item stored once");
    // Each call's items stay next to each other, in the order given.
    for pair in listed.chunks(2) {
        assert!(pair[0].id.ends_with("_a") && pair[1].id == pair[0].id.replace("_a", "_b"));
    }
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> Self {
        let unique = format!(
            "extproc-{label}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        );
        let path = std::env::temp_dir().join(unique);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_memory_store_conforms() {
    conforms(&(Arc::new(MemoryStore::default()) as Arc<dyn StoreBackend>));
}

#[test]
fn the_sqlite_store_conforms() {
    let dir = TempDir::new("sqlite");
    let path = dir.path().join("state/responses.db");
    let store = open(&format!("sqlite:{}", path.display())).unwrap();
    conforms(&store);
    let mode: String = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn sqlite_stores_of_one_file_write_concurrently() {
    // Separate connections to one file, as two processes would have: the busy timeout lets them take turns.
    let dir = TempDir::new("sqlite-shared");
    let path = dir.path().join("responses.db");
    let [one, two, three] = [(); 3].map(|()| as_owner(SqliteStore::open(&path).unwrap()));
    concurrent_writers(&[&one, &two, &three]);
}

#[test]
fn sqlite_rows_from_before_owners_belong_to_the_keyless_tenant() {
    let dir = TempDir::new("sqlite-schema-1");
    let path = dir.path().join("responses.db");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(&schema_1_database(SQLITE_MIGRATIONS[0]))
        .unwrap();
    let backend: Arc<dyn StoreBackend> = Arc::new(SqliteStore::open(&path).unwrap());
    rows_from_before_owners_are_the_keyless_tenants(&backend);
    let version: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT version FROM schema_version", [], |row| row.get(0))
        .unwrap();
    assert_eq!(version, SQLITE_MIGRATIONS.len() as i64);
}

#[test]
fn a_sqlite_store_reads_after_a_reopen_what_it_wrote() {
    let dir = TempDir::new("sqlite-reopen");
    let path = dir.path().join("responses.db");
    let stored = response("resp_p1", Some("conv_p1"));
    let reopen = || as_owner(SqliteStore::open(&path).unwrap());
    {
        let store = reopen();
        store
            .create_conversation(&conversation("conv_p1"), &[item("p0")])
            .unwrap();
        store.put_response(&stored, &[item("p1")]).unwrap();
    }
    let store = reopen();
    assert_eq!(store.get_response("resp_p1").unwrap(), Some(stored));
    assert_eq!(
        store.get_conversation("conv_p1").unwrap(),
        Some(conversation("conv_p1"))
    );
    let listed = store.list_items("conv_p1", None, 10, Order::Asc).unwrap();
    assert_eq!(ids(&listed), ["p0", "p1"]);
    // Positions carry on after the reopen.
    assert_eq!(positions(&store.add_items("conv_p1", &[item("p2")]).unwrap()), [2]);
}

#[test]
fn a_sqlite_schema_newer_than_the_code_is_refused() {
    let dir = TempDir::new("sqlite-newer");
    let path = dir.path().join("responses.db");
    drop(SqliteStore::open(&path).unwrap());
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute("UPDATE schema_version SET version = 999", [])
        .unwrap();
    let error = SqliteStore::open(&path).err().expect("refused");
    assert!(
        error.to_string().contains("schema is version 999, newer than"),
        "{error}"
    );
}

#[test]
fn an_unknown_store_spec_is_refused() {
    let error = open("mysql://x").err().expect("refused");
    assert!(error.to_string().contains("unknown response store"), "{error}");
}

/// PostgreSQL: one throwaway cluster for the whole run (starting one costs a few seconds), a fresh
/// database per check.
#[test]
fn the_postgres_store_conforms_and_persists() {
    let cluster = PgCluster::start();

    let url = cluster.create_database("conformance");
    let store = open(&url).unwrap();
    conforms(&store);
    drop(store);

    // Two stores on one database, as two gateway replicas: concurrent writers still get unique positions.
    let url = cluster.create_database("replicas");
    let replica = || as_owner(PostgresStore::open(&url).unwrap());
    let (one, two) = (replica(), replica());
    concurrent_writers(&[&one, &two]);
    drop((one, two));

    // A database of schema 1 is migrated; its rows are the keyless tenant's.
    let url = cluster.create_database("schema1");
    cluster.execute("schema1", &schema_1_database(POSTGRES_MIGRATIONS[0]));
    rows_from_before_owners_are_the_keyless_tenants(&open(&url).unwrap());

    // A reopen reads what was written.
    let url = cluster.create_database("reopen");
    let stored = response("resp_p1", Some("conv_p1"));
    let reopen = || as_owner(PostgresStore::open(&url).unwrap());
    {
        let store = reopen();
        store
            .create_conversation(&conversation("conv_p1"), &[item("p0")])
            .unwrap();
        store.put_response(&stored, &[item("p1")]).unwrap();
    }
    let store = reopen();
    assert_eq!(store.get_response("resp_p1").unwrap(), Some(stored.clone()));
    let listed = store.list_items("conv_p1", None, 10, Order::Asc).unwrap();
    assert_eq!(ids(&listed), ["p0", "p1"]);

    // The server restarts under an open store: its pooled connections are stale, the next call reconnects.
    cluster.restart();
    assert_eq!(store.get_response("resp_p1").unwrap(), Some(stored));
    assert_eq!(positions(&store.add_items("conv_p1", &[item("p2")]).unwrap()), [2]);
    drop(store);

    // A schema newer than the code is refused.
    cluster.execute("reopen", "UPDATE schema_version SET version = 999");
    let error = PostgresStore::open(&url).err().expect("refused");
    assert!(
        error.to_string().contains("schema is version 999, newer than"),
        "{error}"
    );

    // The request path calls the store from spawn_blocking threads of a multi-thread runtime (where a
    // nested runtime would panic), and may drop the last reference on an async worker.
    let url = cluster.create_database("runtime");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let store: Arc<dyn ResponseStore> = {
            let url = url.clone();
            let backend = tokio::task::spawn_blocking(move || open(&url).unwrap()).await.unwrap();
            Arc::new(view(&backend, None))
        };
        let calls = (0..4).map(|n| {
            let store = store.clone();
            tokio::task::spawn_blocking(move || {
                let id = format!("resp_t{n}");
                store.put_response(&response(&id, None), &[]).unwrap();
                store.get_response(&id).unwrap().expect("stored").id
            })
        });
        for (n, call) in calls.enumerate() {
            assert_eq!(call.await.unwrap(), format!("resp_t{n}"));
        }
        drop(store);
    });
}

#[test]
fn an_unreachable_postgres_server_is_a_backend_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = std::time::Instant::now();
    let error = open(&format!("postgres://nobody@127.0.0.1:{port}/none"))
        .err()
        .expect("refused");
    assert!(matches!(error, StoreError::Backend(_)), "{error:?}");
    assert!(error.to_string().contains("connecting to PostgreSQL"), "{error}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}
