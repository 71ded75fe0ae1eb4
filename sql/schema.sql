-- Warehouse tables and views (idempotent; run by Warehouse() on open).
-- impressions: the clean rows of every ingested month (one partition per `month`, replaced as a whole).
-- No PRIMARY KEY: uniqueness of impression_id is enforced by ingest_check.sql (and checked again by the
-- Great Expectations suite); a DuckDB index would slow the bulk delete+insert of a month.
CREATE TABLE IF NOT EXISTS impressions (
    month           VARCHAR     NOT NULL,
    impression_id   VARCHAR     NOT NULL,
    event_time      TIMESTAMPTZ NOT NULL,
    user_id         BIGINT      NOT NULL,
    arm             VARCHAR     NOT NULL,
    model_version   VARCHAR     NOT NULL,
    history         BIGINT[]    NOT NULL,
    candidates      BIGINT[]    NOT NULL,
    item_id         BIGINT      NOT NULL,
    propensity      DOUBLE      NOT NULL,
    clicked         TINYINT     NOT NULL,
    request_id      VARCHAR     NOT NULL,
    position        SMALLINT    NOT NULL,
    logging_policy  VARCHAR     NOT NULL,
    served_at       TIMESTAMPTZ NOT NULL,
    schema_version  SMALLINT    NOT NULL,
    source_file     VARCHAR     NOT NULL,
    source_row      BIGINT      NOT NULL
);

-- quarantine: rows that broke the contract, as landed (any field may be null), with the first rule
-- they broke (priority order of ingest_check.sql) and a detail naming the field or the value.
CREATE TABLE IF NOT EXISTS quarantine (
    month           VARCHAR     NOT NULL,
    rule            VARCHAR     NOT NULL,
    detail          VARCHAR     NOT NULL,
    source_file     VARCHAR     NOT NULL,
    source_row      BIGINT      NOT NULL,
    impression_id   VARCHAR,
    event_time      TIMESTAMPTZ,
    user_id         BIGINT,
    arm             VARCHAR,
    model_version   VARCHAR,
    history         BIGINT[],
    candidates      BIGINT[],
    item_id         BIGINT,
    propensity      DOUBLE,
    clicked         TINYINT,
    request_id      VARCHAR,
    position        SMALLINT,
    logging_policy  VARCHAR,
    served_at       TIMESTAMPTZ,
    schema_version  SMALLINT
);

-- ingest_runs: one row per successful ingest (the audit trail of what replaced what).
CREATE TABLE IF NOT EXISTS ingest_runs (
    month               VARCHAR     NOT NULL,
    ingested_at         TIMESTAMPTZ NOT NULL,
    files               VARCHAR[]   NOT NULL,
    rows_in             BIGINT      NOT NULL,
    rows_clean          BIGINT      NOT NULL,
    rows_quarantined    BIGINT      NOT NULL,
    rows_replaced       BIGINT      NOT NULL,
    quarantined_by_rule MAP(VARCHAR, BIGINT) NOT NULL
);

-- Strata of the bandit feedback y (ABPO_SPEC.md step 3: B_1 positive, B_0 no-response).
CREATE OR REPLACE VIEW impressions_positive AS
SELECT * FROM impressions WHERE clicked = 1;

CREATE OR REPLACE VIEW impressions_no_response AS
SELECT * FROM impressions WHERE clicked = 0;

-- user_month_stats: the clean impressions of a month summed per (arm, user): the small aggregate the A/B
-- report reads (sql/report_user_moments.sql) instead of the raw rows, so its cost follows the number of
-- user-months, not of impressions. Rebuilt for a month from that month's clean partition inside the
-- ingest transaction (sql/user_month_stats_*.sql); (month, arm, user_id) is unique by construction.
CREATE TABLE IF NOT EXISTS user_month_stats (
    month           VARCHAR     NOT NULL,
    arm             VARCHAR     NOT NULL,
    user_id         BIGINT      NOT NULL,
    impressions     BIGINT      NOT NULL,
    clicks          BIGINT      NOT NULL
);

-- user_month_stats_built: which months user_month_stats holds, and from which state of the month: the
-- number of ingest runs of the month it reflects. A month whose count in ingest_runs differs (ingested
-- by code that did not maintain the aggregate) or that has no row here is rebuilt when the warehouse
-- is opened (Warehouse.stale_aggregate_months).
CREATE TABLE IF NOT EXISTS user_month_stats_built (
    month           VARCHAR     PRIMARY KEY,
    ingest_runs     BIGINT      NOT NULL,
    users           BIGINT      NOT NULL,
    impressions     BIGINT      NOT NULL,
    clicks          BIGINT      NOT NULL,
    built_at        TIMESTAMPTZ NOT NULL
);

-- impressions_history: clean rows a later ingest (or restore) of their month replaced, kept so the previous version
-- of a month can be restored (Warehouse.restore_month). `version` counts the month's replaced versions (1, 2, ...).
CREATE TABLE IF NOT EXISTS impressions_history AS
SELECT *, NULL::TIMESTAMPTZ AS replaced_at, NULL::INTEGER AS version FROM impressions LIMIT 0;

-- interactions: what users consumed each month (landing/interactions/month=YYYY-MM/, from serving's logs or the
-- simulator), one partition per `month`, replaced as a whole by Warehouse.ingest_interactions. The ranker arms are
-- refitted on the interactions to date (sql/interactions_to_date.sql) and the clicks.
CREATE TABLE IF NOT EXISTS interactions (
    month           VARCHAR     NOT NULL,
    user_id         BIGINT      NOT NULL,
    item_id         BIGINT      NOT NULL,
    event_time      TIMESTAMPTZ,
    position        INTEGER     NOT NULL,
    source_file     VARCHAR     NOT NULL
);

-- interactions_quarantine: landed interactions that broke a rule (item_not_in_catalog: an item the catalog does not
-- hold), kept with the rule and a detail instead of reaching `interactions` (and the ranker arms' refits).
CREATE TABLE IF NOT EXISTS interactions_quarantine (
    month           VARCHAR     NOT NULL,
    rule            VARCHAR     NOT NULL,
    detail          VARCHAR     NOT NULL,
    user_id         BIGINT,
    item_id         BIGINT,
    event_time      TIMESTAMPTZ,
    position        INTEGER,
    source_file     VARCHAR     NOT NULL
);
