//! The busy guard's transitions, driven by plain calls: no runtime, no
//! store, no adapter.

use super::*;
use crate::event::SessionSource;

fn message(user: &str, text: &str) -> Queued {
    let mut event = MessageEvent::text(SessionSource::dm("telegram", "42", user), text);
    event.message_id = Some(format!("m-{text}"));
    Queued {
        event,
        mergeable: true,
        owed: vec![format!("owed-{text}")],
    }
}

/// A lane running generation 1, as the first message leaves it.
fn running(mode: BusyInputMode) -> Lane {
    let mut lane = Lane::default();
    match lane.submit(message("7", "first"), mode, || 1) {
        Submitted::Start { generation, .. } => assert_eq!(generation, 1),
        other => panic!("an idle lane starts a run: {other:?}"),
    }
    lane
}

fn busy(lane: &mut Lane, item: Queued, mode: BusyInputMode) -> (Option<Ack>, Option<Queued>) {
    match lane.submit(item, mode, || unreachable!("a busy lane starts no run")) {
        Submitted::Busy { ack, dropped } => (ack, dropped),
        other => panic!("a busy lane queues: {other:?}"),
    }
}

fn texts(lane: &Lane) -> Vec<&str> {
    lane.queue.iter().map(|q| q.event.text.as_str()).collect()
}

#[test]
fn an_idle_lane_starts_a_run_with_the_message() {
    let mut lane = Lane::default();
    assert!(!lane.running());
    let Submitted::Start {
        item,
        generation,
        cancel,
    } = lane.submit(message("7", "hello"), BusyInputMode::Interrupt, || 9)
    else {
        panic!("idle lanes start");
    };
    assert_eq!((item.event.text.as_str(), generation), ("hello", 9));
    assert!(!cancel.is_cancelled());
    assert!(lane.running());
    assert_eq!(lane.arrivals, 1);
    assert!(lane.queue.is_empty());
}

#[test]
fn queue_mode_merges_follow_ups_from_one_sender_and_keeps_the_run() {
    let mode = BusyInputMode::Queue;
    let mut lane = running(mode);
    assert_eq!(
        busy(&mut lane, message("7", "two"), mode).0,
        Some(Ack::Queued)
    );
    assert_eq!(
        busy(&mut lane, message("7", "three"), mode).0,
        Some(Ack::Queued)
    );
    // Another sender's message is a turn of its own.
    busy(&mut lane, message("8", "other"), mode);
    assert_eq!(texts(&lane), vec!["two\nthree", "other"]);
    assert_eq!(lane.queue[0].owed, vec!["owed-two", "owed-three"]);
    assert_eq!(lane.queue[0].event.message_id.as_deref(), Some("m-three"));
    assert!(lane.running(), "queue mode does not interrupt");
    assert_eq!(lane.arrivals, 4);
}

#[test]
fn steer_mode_passes_the_message_to_a_routed_run_and_carries_its_owed_turn() {
    let mode = BusyInputMode::Steer;
    let mut lane = running(mode);
    // Not routed yet: nothing to steer, so it waits like queue mode.
    assert_eq!(
        busy(&mut lane, message("7", "early"), mode).0,
        Some(Ack::Queued)
    );
    let state = Arc::new(SessionState::default());
    lane.run_of(1).unwrap().state = Some(state.clone());
    assert_eq!(
        busy(&mut lane, message("7", "late"), mode).0,
        Some(Ack::Steered)
    );
    assert_eq!(state.take_steer(), vec!["late"]);
    assert_eq!(lane.carried, vec!["owed-late"]);
    assert_eq!(texts(&lane), vec!["early"]);
    // A `/queue` item is never steered.
    let mut queued = message("7", "explicit");
    queued.mergeable = false;
    assert_eq!(busy(&mut lane, queued, mode).0, Some(Ack::Queued));
    assert_eq!(texts(&lane), vec!["early", "explicit"]);
}

#[test]
fn interrupt_mode_stops_the_run_and_acknowledges_once() {
    let mode = BusyInputMode::Interrupt;
    let mut lane = running(mode);
    let cancel = lane.run.as_ref().unwrap().cancel.clone();
    assert_eq!(
        busy(&mut lane, message("7", "second"), mode).0,
        Some(Ack::Interrupting)
    );
    assert!(cancel.is_cancelled());
    assert!(!lane.running(), "the run is told to stop");
    assert!(
        lane.run.is_some(),
        "but the lane stays busy until it unwinds"
    );
    // The run is already stopping: no second notice.
    assert_eq!(busy(&mut lane, message("7", "third"), mode).0, None);
    assert_eq!(texts(&lane), vec!["second\nthird"]);
}

#[test]
fn a_full_queue_hands_the_message_back() {
    let mode = BusyInputMode::Queue;
    let mut lane = running(mode);
    for i in 0..MAX_QUEUED {
        // Different senders, so nothing merges.
        let (_, dropped) = busy(&mut lane, message(&i.to_string(), "x"), mode);
        assert!(dropped.is_none());
    }
    let (_, dropped) = busy(&mut lane, message("last", "too many"), mode);
    assert_eq!(dropped.map(|d| d.event.text), Some("too many".to_owned()));
    assert_eq!(lane.queue.len(), MAX_QUEUED);
}

#[test]
fn explicit_queue_items_are_their_own_turns_and_survive_stop() {
    let mode = BusyInputMode::Interrupt;
    let mut idle = Lane::default();
    let item = Queued::alone(message("7", "now").event);
    assert!(matches!(idle.queue_explicit(item), Explicit::Idle(q) if q.event.text == "now"));

    let mut lane = running(mode);
    assert!(matches!(
        lane.queue_explicit(Queued::alone(message("7", "b").event)),
        Explicit::Queued(1)
    ));
    assert!(matches!(
        lane.queue_explicit(Queued::alone(message("7", "c").event)),
        Explicit::Queued(2)
    ));
    busy(&mut lane, message("7", "follow-up"), BusyInputMode::Queue);
    assert_eq!(texts(&lane), vec!["b", "c", "follow-up"]);

    let (tx, rx) = oneshot::channel();
    lane.approval = Some(tx);
    assert!(lane.stop(false), "a run was going");
    assert_eq!(texts(&lane), vec!["b", "c"], "/stop keeps what /queue put");
    assert!(
        rx.blocking_recv().is_err(),
        "the waiting approval is denied"
    );
    assert!(!lane.stop(false), "nothing runs any more");
    lane.stop(true);
    assert!(lane.queue.is_empty(), "/new clears everything");

    let mut full = running(mode);
    for _ in 0..MAX_QUEUED {
        full.queue_explicit(Queued::alone(message("7", "x").event));
    }
    assert!(matches!(
        full.queue_explicit(Queued::alone(message("7", "y").event)),
        Explicit::Full
    ));
}

#[test]
fn steering_needs_a_routed_run_that_is_not_stopping() {
    let mut lane = running(BusyInputMode::Steer);
    assert!(!lane.steer("too early"));
    let state = Arc::new(SessionState::default());
    lane.run_of(1).unwrap().state = Some(state.clone());
    assert!(lane.steer("look at the logs"));
    assert_eq!(state.take_steer(), vec!["look at the logs"]);
    lane.interrupt();
    assert!(!lane.steer("too late"));
}

#[test]
fn approvals_reach_the_waiting_command_once() {
    let mut lane = Lane::default();
    assert!(!lane.answer_approval(ApprovalDecision::Once));
    let (tx, mut rx) = oneshot::channel();
    lane.approval = Some(tx);
    assert!(lane.answer_approval(ApprovalDecision::Session));
    assert_eq!(rx.try_recv().ok(), Some(ApprovalDecision::Session));
    assert!(!lane.answer_approval(ApprovalDecision::Deny));
}

#[test]
fn a_superseded_run_carries_its_owed_turns_into_the_next_one() {
    let mode = BusyInputMode::Interrupt;
    let mut lane = running(mode);
    busy(&mut lane, message("7", "second"), mode);
    assert!(lane.turn_over(1, &message("7", "first").event, Vec::new()));
    let ended = lane.ended(RunEnd::Superseded, vec!["owed-first".into()], false, mode);
    assert_eq!(
        ended,
        Ended {
            settle: Vec::new(),
            coalesce: true
        }
    );
    let Next::Run {
        item,
        generation,
        cancel,
    } = lane.next(false, || 2)
    else {
        panic!("the queued message runs next");
    };
    assert_eq!((item.event.text.as_str(), generation), ("second", 2));
    assert!(!cancel.is_cancelled());
    assert_eq!(lane.take_carried(), vec!["owed-first"]);
}

#[test]
fn a_stopped_run_settles_what_it_owed_and_the_lane_goes_idle() {
    let mode = BusyInputMode::Queue;
    let mut lane = running(mode);
    lane.stop(false);
    assert!(lane.turn_over(1, &message("7", "first").event, Vec::new()));
    let ended = lane.ended(RunEnd::Superseded, vec!["owed-first".into()], false, mode);
    assert_eq!(ended.settle, vec!["owed-first"]);
    assert!(!ended.coalesce);
    lane.carried.push("steered".into());
    let Next::Idle { leftover, forget } = lane.next(false, || unreachable!()) else {
        panic!("nothing is queued");
    };
    assert_eq!(leftover, vec!["steered"]);
    assert!(forget);
    assert!(lane.run.is_none() && !lane.running());
}

#[test]
fn a_finished_run_keeps_late_steering_for_the_next_turn() {
    let mode = BusyInputMode::Steer;
    let mut lane = running(mode);
    let discard = lane.turn_over(1, &message("7", "first").event, vec!["and also".into()]);
    assert!(!discard, "an answered turn is delivered");
    assert!(lane.ended(RunEnd::Done, vec!["x".into()], false, mode) == Ended::default());
    let Next::Run { item, .. } = lane.next(false, || 2) else {
        panic!("the late steering runs");
    };
    assert_eq!(item.event.text, "and also");
    assert_eq!(item.event.message_id, None);
    // A newer run's lane does not drop an older run's result by mistake.
    assert!(lane.turn_over(1, &message("7", "first").event, Vec::new()));
    assert!(!lane.turn_over(2, &message("7", "first").event, Vec::new()));
}

#[test]
fn draining_runs_nothing_more_and_settles_nothing() {
    let mode = BusyInputMode::Interrupt;
    let mut lane = running(mode);
    busy(&mut lane, message("7", "second"), mode);
    lane.carried.push("carried".into());
    lane.shut_down();
    assert!(lane.queue.is_empty());
    assert!(lane.run.as_ref().unwrap().cancel.is_cancelled());
    let ended = lane.ended(RunEnd::Superseded, vec!["owed".into()], true, mode);
    assert_eq!(ended, Ended::default(), "a restart runs them again");
    let Next::Idle { leftover, forget } = lane.next(true, || unreachable!()) else {
        panic!("nothing runs while draining");
    };
    assert!(leftover.is_empty());
    assert!(forget);
}

#[test]
fn a_lane_with_a_waiting_question_is_kept() {
    let mut lane = running(BusyInputMode::Queue);
    let (tx, _rx) = oneshot::channel();
    lane.clarify = Some(tx);
    let Next::Idle { forget, .. } = lane.next(false, || unreachable!()) else {
        panic!("idle");
    };
    assert!(!forget);
}

#[test]
fn a_lost_lease_interrupts_only_its_own_run() {
    let mut lane = running(BusyInputMode::Queue);
    lane.interrupt_generation(7);
    assert!(lane.running());
    lane.interrupt_generation(1);
    assert!(!lane.running());
}
