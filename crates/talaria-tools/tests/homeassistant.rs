//! The `ha_*` tools against the fake Home Assistant REST API on
//! 127.0.0.1, with a scripted human answering approvals.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_agent::interaction::{ApprovalDecision, ApprovalRequest, ClarifyRequest, Interaction};
use talaria_agent::tools::{SessionState, Tool, ToolContext};
use talaria_core::{Config, Home, Redactor};
use talaria_platforms::homeassistant::HomeAssistantSettings;
use talaria_testkit::FakeHomeAssistant;
use talaria_tools::homeassistant::ha_tools;
use tokio_util::sync::CancellationToken;

const HASS_TOKEN: &str = "hass-long-lived-token-0123456789";
const CONV_SECRET: &str = "conversation-secret-0123456789";

/// A human whose answers are scripted; records what it was asked.
#[derive(Default)]
struct Scripted {
    decisions: Mutex<VecDeque<ApprovalDecision>>,
    asked: Mutex<Vec<ApprovalRequest>>,
}

#[async_trait]
impl Interaction for Scripted {
    async fn approve(&self, request: &ApprovalRequest) -> ApprovalDecision {
        self.asked.lock().unwrap().push(request.clone());
        self.decisions
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(ApprovalDecision::Deny)
    }

    async fn clarify(&self, _request: &ClarifyRequest) -> Option<String> {
        None
    }
}

struct ToolRig {
    ha: FakeHomeAssistant,
    tools: Vec<Arc<dyn Tool>>,
    human: Arc<Scripted>,
    ctx: ToolContext,
    _dir: tempfile::TempDir,
}

async fn tool_rig(allowed: &[&str], decisions: &[ApprovalDecision]) -> ToolRig {
    let ha = FakeHomeAssistant::start(HASS_TOKEN).await;
    let mut settings = HomeAssistantSettings::new(Some(&ha.url()), Some(HASS_TOKEN), None);
    settings.allowed_services = allowed.iter().map(|s| s.to_string()).collect();
    let tools = ha_tools(&settings).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    home.ensure().unwrap();
    let store = Arc::new(talaria_store::SqliteStore::open(&home.state_db()).unwrap());
    let human = Arc::new(Scripted {
        decisions: Mutex::new(decisions.iter().copied().collect()),
        ..Scripted::default()
    });
    let ctx = ToolContext {
        session_id: "s1".into(),
        home,
        workdir: dir.path().to_path_buf(),
        config: Arc::new(Config::default()),
        store,
        interaction: human.clone(),
        session: Arc::new(SessionState::default()),
        redactor: Redactor::default(),
        cancel: CancellationToken::new(),
        execution: talaria_agent::Execution::local(dir.path()),
        tools: std::sync::Arc::new(talaria_agent::tools::Registry::new()),
        platform: None,
        progress: talaria_agent::Progress::none(),
    };
    ToolRig {
        ha,
        tools,
        human,
        ctx,
        _dir: dir,
    }
}

impl ToolRig {
    async fn call(&self, name: &str, args: Value) -> Result<String, String> {
        let tool = self
            .tools
            .iter()
            .find(|t| t.name() == name)
            .unwrap_or_else(|| panic!("no tool {name}"));
        tool.call(args, &self.ctx).await.map_err(|e| e.0)
    }
}

#[tokio::test]
async fn the_tools_are_only_there_with_url_and_token_and_stay_small() {
    let none = HomeAssistantSettings::new(None, None, Some(CONV_SECRET));
    assert!(ha_tools(&none).unwrap().is_empty());
    let rig = tool_rig(&[], &[]).await;
    let mut names: Vec<&str> = rig.tools.iter().map(|t| t.name()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "ha_call_service",
            "ha_get_state",
            "ha_list_entities",
            "ha_list_services"
        ]
    );
    let spec_size: usize = rig
        .tools
        .iter()
        .map(|t| serde_json::to_string(&t.spec()).unwrap().len())
        .sum();
    assert!(spec_size < 2000, "the four specs take {spec_size} bytes");
}

#[tokio::test]
async fn read_only_lookups_never_ask() {
    let rig = tool_rig(&[], &[]).await;
    let all = rig.call("ha_list_entities", json!({})).await.unwrap();
    assert!(all.contains("light.kitchen | on | Kitchen Light"), "{all}");
    assert!(all.contains("sensor.outside_temperature | 12.5"), "{all}");
    let lights = rig
        .call("ha_list_entities", json!({"domain": "light"}))
        .await
        .unwrap();
    assert_eq!(lights.lines().count(), 2, "{lights}");
    let found = rig
        .call("ha_list_entities", json!({"search": "coffee"}))
        .await
        .unwrap();
    assert_eq!(found, "switch.coffee_maker | off | Coffee Maker");

    let state = rig
        .call(
            "ha_get_state",
            json!({"entity_id": "sensor.outside_temperature"}),
        )
        .await
        .unwrap();
    let state: Value = serde_json::from_str(&state).unwrap();
    assert_eq!(state["state"], "12.5");
    assert_eq!(state["attributes"]["unit_of_measurement"], "°C");
    let missing = rig
        .call("ha_get_state", json!({"entity_id": "light.garage"}))
        .await
        .unwrap_err();
    assert_eq!(missing, "no entity light.garage");

    let domains = rig.call("ha_list_services", json!({})).await.unwrap();
    assert!(
        domains.contains("light: toggle, turn_off, turn_on"),
        "{domains}"
    );
    let light = rig
        .call("ha_list_services", json!({"domain": "light"}))
        .await
        .unwrap();
    assert!(
        light.contains(
            "light.turn_on: Turns on one or more lights. (fields: brightness_pct, color_name)"
        ),
        "{light}"
    );
    assert!(rig.human.asked.lock().unwrap().is_empty());
    assert!(rig.ha.calls().is_empty());
}

#[tokio::test]
async fn a_call_allowed_by_pattern_runs_without_asking() {
    let rig = tool_rig(&["light.*", "media_player.volume_set"], &[]).await;
    let out = rig
        .call(
            "ha_call_service",
            json!({"domain": "light", "service": "turn_on", "entity_id": "light.living_room",
                   "data": {"brightness_pct": 40}}),
        )
        .await
        .unwrap();
    assert!(out.contains("light.living_room | on"), "{out}");
    let calls = rig.ha.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].data,
        json!({"entity_id": "light.living_room", "brightness_pct": 40})
    );
    assert_eq!(rig.ha.state("light.living_room").as_deref(), Some("on"));
    assert!(rig.human.asked.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_call_not_allowed_asks_and_a_denial_calls_nothing() {
    let rig = tool_rig(
        &["light.*"],
        &[ApprovalDecision::Deny, ApprovalDecision::Session],
    )
    .await;
    let unlock = json!({"domain": "lock", "service": "unlock", "entity_id": "lock.front_door"});
    let denied = rig
        .call("ha_call_service", unlock.clone())
        .await
        .unwrap_err();
    assert!(
        denied.contains("did NOT allow calling lock.unlock"),
        "{denied}"
    );
    assert!(rig.ha.calls().is_empty(), "nothing was called");
    assert_eq!(rig.ha.state("lock.front_door").as_deref(), Some("locked"));
    let asked = rig.human.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert!(asked[0].command.contains("lock.unlock"), "{:?}", asked[0]);
    assert!(
        asked[0].command.contains("lock.front_door"),
        "{:?}",
        asked[0]
    );

    // Approved for the session: runs now, and next time without asking.
    rig.call("ha_call_service", unlock.clone()).await.unwrap();
    assert_eq!(rig.ha.state("lock.front_door").as_deref(), Some("unlocked"));
    rig.call("ha_call_service", unlock).await.unwrap();
    assert_eq!(rig.human.asked.lock().unwrap().len(), 2);
    assert_eq!(rig.ha.calls().len(), 2);
}

#[tokio::test]
async fn ids_that_would_reach_other_paths_are_refused_before_any_request() {
    let rig = tool_rig(&["*"], &[]).await;
    for (tool, args) in [
        (
            "ha_get_state",
            json!({"entity_id": "../services/lock/unlock"}),
        ),
        (
            "ha_get_state",
            json!({"entity_id": "light.kitchen/../../config"}),
        ),
        ("ha_get_state", json!({"entity_id": "light.kitchen?x=1"})),
        ("ha_list_entities", json!({"domain": "light/../.."})),
        (
            "ha_call_service",
            json!({"domain": "lock/../light", "service": "turn_on"}),
        ),
        (
            "ha_call_service",
            json!({"domain": "light", "service": "turn_on/../../states"}),
        ),
        (
            "ha_call_service",
            json!({"domain": "light", "service": "turn_on", "entity_id": "../x"}),
        ),
    ] {
        let e = rig.call(tool, args.clone()).await.unwrap_err();
        assert!(e.contains("must"), "{tool} {args}: {e}");
    }
    assert!(rig.ha.calls().is_empty());
}

#[tokio::test]
async fn a_refused_token_is_said_plainly() {
    let ha = FakeHomeAssistant::start(HASS_TOKEN).await;
    let settings = HomeAssistantSettings::new(Some(&ha.url()), Some("stale-token"), None);
    let tools = ha_tools(&settings).unwrap();
    let rig = tool_rig(&[], &[]).await;
    let list = tools
        .iter()
        .find(|t| t.name() == "ha_list_entities")
        .unwrap();
    let e = list.call(json!({}), &rig.ctx).await.unwrap_err();
    assert!(e.0.starts_with("HASS_TOKEN was refused"), "{e}");
    assert_eq!(ha.unauthorized(), 1);
}
