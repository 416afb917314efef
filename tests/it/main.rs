//! Every integration test in one binary (one link on two cores, not eight),
//! each file a module, against a real PostgreSQL (a fresh database per test).

mod alerts;
mod api;
mod api_access;
mod archive;
mod batch;
mod brokers;
mod console;
mod database;
mod declared;
mod destinations;
mod erase;
mod group;
mod handlers;
mod hints;
mod hostile;
mod layout;
mod listing;
mod metrics;
mod migrate;
mod partitioning;
mod pauses;
mod payload;
mod process;
mod receive;
mod reconcile;
mod relay;
mod retention;
mod rules;
mod sdk;
mod secrets;
mod testing;
