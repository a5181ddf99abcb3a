"""The store's schema as an ordered list of migrations, and BASELINE, the schema they make.

A store records the number of migrations applied (`meta.schema_version`); opening it runs
the missing ones in one transaction. To change the schema, append a migration (never edit
a released one), bump nothing else (SCHEMA_VERSION is the list's length), and write the
result into BASELINE, the readable statement of every table's columns in one place
(tests/test_store.py checks that a freshly migrated store equals it). storage/rows.py holds
one row dataclass per table written by stages, with the same columns.

Conventions the Store relies on:
- every table has a primary key (merge uses it to find collisions);
- tables whose rows a stage produces carry a `stage` column (force-rerun clears by it);
  `nodes` belong to their tree and are cleared with it;
- JSON columns hold any JSON value and round-trip as Python objects;
- ids are chosen by the writer and deterministic, so a resumed or sharded job never
  duplicates a row: node and trajectory ids come from storage/ids.py.
"""

from __future__ import annotations

V1 = [
    """CREATE TABLE meta (
        key VARCHAR PRIMARY KEY,
        value VARCHAR NOT NULL)""",
    """CREATE TABLE runs (
        run_id VARCHAR PRIMARY KEY,
        created_at TIMESTAMP NOT NULL DEFAULT current_localtimestamp(),
        updated_at TIMESTAMP NOT NULL DEFAULT current_localtimestamp(),
        config JSON NOT NULL)""",
    """CREATE TABLE stages (
        stage VARCHAR NOT NULL,
        shard VARCHAR NOT NULL,              -- '' for unsharded stages, else 'i/n'
        status VARCHAR NOT NULL,             -- running | done | failed
        config_hash VARCHAR NOT NULL,
        config JSON NOT NULL,                -- the sections the hash covers, for diffs
        stats JSON,
        started_at TIMESTAMP NOT NULL DEFAULT current_localtimestamp(),
        finished_at TIMESTAMP,
        PRIMARY KEY (stage, shard))""",
    """CREATE TABLE checkpoints (
        stage VARCHAR NOT NULL,
        shard VARCHAR NOT NULL,
        key VARCHAR NOT NULL,
        value JSON,
        updated_at TIMESTAMP NOT NULL DEFAULT current_localtimestamp(),
        PRIMARY KEY (stage, shard, key))""",
    """CREATE TABLE tasks (
        task_id VARCHAR PRIMARY KEY,
        idx INTEGER NOT NULL,                -- position in the run: train tasks, then test
        env VARCHAR NOT NULL,
        split VARCHAR NOT NULL,
        instruction VARCHAR NOT NULL,
        data JSON,
        stage VARCHAR NOT NULL)""",
    """CREATE TABLE trees (
        tree_id BIGINT PRIMARY KEY,
        task_id VARCHAR NOT NULL,
        status VARCHAR NOT NULL,             -- running | done
        simulations_done INTEGER NOT NULL DEFAULT 0,
        best_reward DOUBLE,
        stage VARCHAR NOT NULL,
        created_at TIMESTAMP NOT NULL DEFAULT current_localtimestamp(),
        updated_at TIMESTAMP NOT NULL DEFAULT current_localtimestamp())""",
    """CREATE TABLE nodes (
        node_id BIGINT PRIMARY KEY,
        tree_id BIGINT NOT NULL,
        parent_id BIGINT,                    -- NULL at the root
        depth INTEGER NOT NULL,
        action VARCHAR,                      -- raw policy text of the edge into this node
        tool_call JSON,                      -- parsed call, NULL when unparseable
        observation VARCHAR,
        visits INTEGER NOT NULL DEFAULT 0,
        value_sum DOUBLE NOT NULL DEFAULT 0,
        critic_rank INTEGER,
        critic_score DOUBLE,
        prior DOUBLE,
        reward DOUBLE,
        terminal BOOLEAN NOT NULL DEFAULT false,
        invalid BOOLEAN NOT NULL DEFAULT false,
        env_snapshot BLOB,                   -- Env.snapshot() after the action
        created_sim INTEGER)""",
    """CREATE TABLE trajectories (
        traj_id BIGINT PRIMARY KEY,
        task_id VARCHAR NOT NULL,
        tree_id BIGINT,
        source VARCHAR NOT NULL,             -- mcts_rollout | eval | ...
        simulation INTEGER,
        steps JSON NOT NULL,
        reward DOUBLE NOT NULL,
        success BOOLEAN NOT NULL,
        achieved VARCHAR,
        stage VARCHAR NOT NULL)""",
    """CREATE TABLE pairs (
        pair_id BIGINT PRIMARY KEY,
        task_id VARCHAR NOT NULL,
        kind VARCHAR NOT NULL,               -- step | trajectory
        node_id BIGINT,                      -- parent node of a step pair
        prompt JSON NOT NULL,
        chosen JSON NOT NULL,
        rejected JSON NOT NULL,
        chosen_q DOUBLE,
        rejected_q DOUBLE,
        margin DOUBLE,
        stage VARCHAR NOT NULL)""",
]

# search: an unvisited child's value can be the best ending one listed step away
# (SearchConfig.finish); `prior` was never written (PUCT reads critic_score)
V2 = [
    "ALTER TABLE nodes ADD COLUMN ending DOUBLE",
    "ALTER TABLE nodes DROP COLUMN prior",
]

# mining, training, evaluation: pair provenance, SFT examples (RFT and hindsight), training
# metrics per step, evaluation episodes per policy
V3 = [
    "ALTER TABLE pairs ADD COLUMN env VARCHAR",
    "ALTER TABLE pairs ADD COLUMN chosen_ref BIGINT",    # node id (step) / traj id (trajectory)
    "ALTER TABLE pairs ADD COLUMN rejected_ref BIGINT",
    "ALTER TABLE pairs ADD COLUMN info JSON",            # anything else of its provenance
    """CREATE TABLE examples (
        example_id BIGINT PRIMARY KEY,
        task_id VARCHAR NOT NULL,            -- the task the messages solve (relabeled for hindsight)
        env VARCHAR NOT NULL,
        kind VARCHAR NOT NULL,               -- rft | hindsight
        instruction VARCHAR NOT NULL,
        messages JSON NOT NULL,              -- the whole conversation, chat dicts
        source_traj BIGINT,                  -- trajectories.traj_id it was made from
        reward DOUBLE,
        info JSON,
        stage VARCHAR NOT NULL)""",
    """CREATE TABLE metrics (
        stage VARCHAR NOT NULL,
        series VARCHAR NOT NULL,             -- e.g. the trained policy's name
        step INTEGER NOT NULL,
        data JSON NOT NULL,                  -- {"loss": ..., "margin": ..., ...}
        PRIMARY KEY (stage, series, step))""",
    """CREATE TABLE eval_episodes (
        policy VARCHAR NOT NULL,             -- base | a trained policy's name
        mode VARCHAR NOT NULL,               -- greedy | mcts
        task_id VARCHAR NOT NULL,
        steps JSON NOT NULL,
        reward DOUBLE NOT NULL,
        success BOOLEAN NOT NULL,
        stage VARCHAR NOT NULL,
        PRIMARY KEY (policy, mode, task_id))""",
]

# search: a node keeps the env's StepResult.info (e.g. cut by the step limit), so trajectories
# rebuilt from stored nodes keep it too
V4 = ["ALTER TABLE nodes ADD COLUMN info JSON"]

# env snapshots as JSON data (Env.snapshot()), never pickles: stores travel between machines
# (merge) and are read on resume, and loading a pickle can run code. An older store's pickles
# were kept aside in `pickled_snapshot` (until V7 dropped it; see PICKLE_COLUMNS).
V5 = [
    "ALTER TABLE nodes RENAME COLUMN env_snapshot TO pickled_snapshot",
    "ALTER TABLE nodes ADD COLUMN snapshot JSON",
]

# search: the ids the policy generated for each action (Step.token_ids), so training trains on
# them and not on the tokenizer's split of the text; NULL for env-listed actions and older rows
V6 = ["ALTER TABLE nodes ADD COLUMN token_ids JSON"]

# the pickle path is gone: no store with pickled snapshots exists outside this repository's
# history. Opening a store that still holds one fails before this runs (Store._migrate).
V7 = ["ALTER TABLE nodes DROP COLUMN pickled_snapshot"]

# search: each node's sum of its simulations' returns had the policy's own playout been
# counted (search.finish backs up the best listed ending instead); the learned critic fits
# these. Trees stored before it take the backed-up sums (equal to them with finish off).
V8 = ["ALTER TABLE nodes ADD COLUMN realized_sum DOUBLE DEFAULT 0",
      "UPDATE nodes SET realized_sum = value_sum"]

# stages: the seconds of a stage's earlier attempts (a resumed stage's time is all of its
# attempts', not only the last one's); 0 for stages stored before it
V9 = ["ALTER TABLE stages ADD COLUMN earlier_seconds DOUBLE NOT NULL DEFAULT 0"]

MIGRATIONS: list[list[str]] = [V1, V2, V3, V4, V5, V6, V7, V8, V9]
SCHEMA_VERSION = len(MIGRATIONS)

# schema versions whose nodes may hold pickled env snapshots, and the column holding them
PICKLE_COLUMNS = {1: "env_snapshot", 2: "env_snapshot", 3: "env_snapshot", 4: "env_snapshot",
                  5: "pickled_snapshot", 6: "pickled_snapshot"}

# The schema MIGRATIONS make, table by table, columns in their stored order (ALTER ... ADD
# COLUMN appends, so a later migration's columns come last).
BASELINE = {
    "meta": """CREATE TABLE meta (
        key VARCHAR PRIMARY KEY,
        value VARCHAR NOT NULL)""",
    "runs": """CREATE TABLE runs (
        run_id VARCHAR PRIMARY KEY,
        created_at TIMESTAMP NOT NULL DEFAULT current_localtimestamp(),
        updated_at TIMESTAMP NOT NULL DEFAULT current_localtimestamp(),
        config JSON NOT NULL)""",
    "stages": """CREATE TABLE stages (
        stage VARCHAR NOT NULL,
        shard VARCHAR NOT NULL,              -- '' for unsharded stages, else 'i/n'
        status VARCHAR NOT NULL,             -- running | done | failed | interrupted
        config_hash VARCHAR NOT NULL,
        config JSON NOT NULL,                -- the sections the hash covers, for diffs
        stats JSON,
        started_at TIMESTAMP NOT NULL DEFAULT current_localtimestamp(),
        finished_at TIMESTAMP,
        earlier_seconds DOUBLE NOT NULL DEFAULT 0,  -- earlier attempts' (a resumed stage)
        PRIMARY KEY (stage, shard))""",
    "checkpoints": """CREATE TABLE checkpoints (
        stage VARCHAR NOT NULL,
        shard VARCHAR NOT NULL,
        key VARCHAR NOT NULL,
        value JSON,
        updated_at TIMESTAMP NOT NULL DEFAULT current_localtimestamp(),
        PRIMARY KEY (stage, shard, key))""",
    "tasks": """CREATE TABLE tasks (
        task_id VARCHAR PRIMARY KEY,
        idx INTEGER NOT NULL,                -- position in the run: train tasks, then test
        env VARCHAR NOT NULL,
        split VARCHAR NOT NULL,
        instruction VARCHAR NOT NULL,
        data JSON,
        stage VARCHAR NOT NULL)""",
    "trees": """CREATE TABLE trees (
        tree_id BIGINT PRIMARY KEY,
        task_id VARCHAR NOT NULL,
        status VARCHAR NOT NULL,             -- running | done
        simulations_done INTEGER NOT NULL DEFAULT 0,
        best_reward DOUBLE,
        stage VARCHAR NOT NULL,
        created_at TIMESTAMP NOT NULL DEFAULT current_localtimestamp(),
        updated_at TIMESTAMP NOT NULL DEFAULT current_localtimestamp())""",
    "nodes": """CREATE TABLE nodes (
        node_id BIGINT PRIMARY KEY,          -- storage/ids.py make_node_id(tree, local id)
        tree_id BIGINT NOT NULL,
        parent_id BIGINT,                    -- NULL at the root
        depth INTEGER NOT NULL,
        action VARCHAR,                      -- raw policy text of the edge into this node
        tool_call JSON,                      -- parsed call, NULL when unparseable
        observation VARCHAR,
        visits INTEGER NOT NULL DEFAULT 0,
        value_sum DOUBLE NOT NULL DEFAULT 0,
        critic_rank INTEGER,
        critic_score DOUBLE,
        reward DOUBLE,
        terminal BOOLEAN NOT NULL DEFAULT false,
        invalid BOOLEAN NOT NULL DEFAULT false,
        created_sim INTEGER,
        ending DOUBLE,                       -- best reward of a listed action ending it here
        info JSON,                           -- the env's StepResult.info
        snapshot JSON,                       -- Env.snapshot() after the action: JSON data
        token_ids JSON,                      -- the ids the policy generated; NULL: env-listed
        realized_sum DOUBLE DEFAULT 0        -- value_sum's returns as the policy played them
        )""",
    "trajectories": """CREATE TABLE trajectories (
        traj_id BIGINT PRIMARY KEY,
        task_id VARCHAR NOT NULL,
        tree_id BIGINT,
        source VARCHAR NOT NULL,             -- mcts_rollout | greedy
        simulation INTEGER,
        steps JSON NOT NULL,
        reward DOUBLE NOT NULL,
        success BOOLEAN NOT NULL,
        achieved VARCHAR,
        stage VARCHAR NOT NULL)""",
    "pairs": """CREATE TABLE pairs (
        pair_id BIGINT PRIMARY KEY,
        task_id VARCHAR NOT NULL,
        kind VARCHAR NOT NULL,               -- step | trajectory
        node_id BIGINT,                      -- parent node of a step pair
        prompt JSON NOT NULL,
        chosen JSON NOT NULL,
        rejected JSON NOT NULL,
        chosen_q DOUBLE,
        rejected_q DOUBLE,
        margin DOUBLE,
        stage VARCHAR NOT NULL,
        env VARCHAR,
        chosen_ref BIGINT,                   -- node id (step) / traj id (trajectory)
        rejected_ref BIGINT,
        info JSON                            -- anything else of its provenance
        )""",
    "examples": """CREATE TABLE examples (
        example_id BIGINT PRIMARY KEY,
        task_id VARCHAR NOT NULL,            -- the task the messages solve (relabeled for hindsight)
        env VARCHAR NOT NULL,
        kind VARCHAR NOT NULL,               -- rft | hindsight
        instruction VARCHAR NOT NULL,
        messages JSON NOT NULL,              -- the whole conversation, chat dicts
        source_traj BIGINT,                  -- trajectories.traj_id it was made from
        reward DOUBLE,
        info JSON,
        stage VARCHAR NOT NULL)""",
    "metrics": """CREATE TABLE metrics (
        stage VARCHAR NOT NULL,
        series VARCHAR NOT NULL,             -- e.g. the trained policy's name
        step INTEGER NOT NULL,
        data JSON NOT NULL,                  -- {"loss": ..., "margin": ..., ...}
        PRIMARY KEY (stage, series, step))""",
    "eval_episodes": """CREATE TABLE eval_episodes (
        policy VARCHAR NOT NULL,             -- base | a trained policy's name
        mode VARCHAR NOT NULL,               -- greedy | mcts (eval.mcts: search at inference)
        task_id VARCHAR NOT NULL,
        steps JSON NOT NULL,
        reward DOUBLE NOT NULL,
        success BOOLEAN NOT NULL,
        stage VARCHAR NOT NULL,
        PRIMARY KEY (policy, mode, task_id))""",
}
