//! Scheduled jobs and their occurrences, on both backends: what a job
//! keeps, which jobs are due, and that an occurrence is claimed once however
//! many schedulers race for it.

use crate::common;

use std::sync::Arc;

use common::{Backend, Fixture};
use talaria_store::{
    Advance, CronJob, CronStore, JobOrigin, JobState, Misfire, NewCronJob, OccurrenceClaim,
    OccurrenceEnd, OccurrenceStatus, StoreError, Trigger,
};
use tokio::sync::Barrier;

/// A first run, as Unix seconds.
const T: i64 = 1_800_000_000;

const JOB: &str = "a1b2c3d4e5f6";

fn new_job(id: &str, name: &str, next_run_at: Option<i64>) -> NewCronJob {
    NewCronJob {
        id: id.to_owned(),
        name: name.to_owned(),
        prompt: Some("Summarise the news".to_owned()),
        skills: vec!["news".to_owned(), "weather".to_owned()],
        schedule: "every 1h".to_owned(),
        deliver: vec!["origin".to_owned(), "telegram:42".to_owned()],
        origin: Some(JobOrigin {
            platform: "telegram".to_owned(),
            chat_id: "42".to_owned(),
            thread_id: Some("7".to_owned()),
        }),
        repeat: Some(3),
        misfire: Misfire::Skip,
        next_run_at,
    }
}

/// The scheduler's claim of the run due at `at`, moving the job to `next`.
fn scheduled(job: &str, at: i64, next: Option<i64>) -> OccurrenceClaim {
    OccurrenceClaim {
        job_id: job.to_owned(),
        scheduled_at: at,
        trigger: Trigger::Schedule,
        status: OccurrenceStatus::Running,
        session_id: Some(format!("cron_{job}_{at}")),
        advance: Some(Advance {
            expected_next: at,
            next_run_at: next,
            counts: true,
        }),
    }
}

/// A run asked for by hand at `at`.
fn manual(job: &str, at: i64) -> OccurrenceClaim {
    OccurrenceClaim {
        job_id: job.to_owned(),
        scheduled_at: at,
        trigger: Trigger::Manual,
        status: OccurrenceStatus::Running,
        session_id: Some(format!("cron_{job}_{at}")),
        advance: None,
    }
}

fn ended(status: OccurrenceStatus) -> OccurrenceEnd {
    OccurrenceEnd {
        status,
        error: None,
        output_path: None,
        delivery_error: None,
    }
}

async fn load<S: CronStore>(store: &S, id: &str) -> CronJob {
    store.job(id).await.unwrap().expect("the job exists")
}

async fn a_job_round_trips_and_is_found_by_id_or_name<S: Backend + CronStore>(f: Fixture<S>) {
    let before = talaria_core::unix_now();
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    let job = load(&*f, JOB).await;
    assert_eq!(job.id, JOB);
    assert_eq!(job.name, "news");
    assert_eq!(job.prompt.as_deref(), Some("Summarise the news"));
    assert_eq!(job.skills, ["news", "weather"]);
    assert_eq!(job.schedule, "every 1h");
    assert_eq!(job.deliver, ["origin", "telegram:42"]);
    assert_eq!(job.origin, new_job(JOB, "news", None).origin);
    assert_eq!(job.repeat, Some(3));
    assert_eq!(job.completed, 0);
    assert_eq!(job.state, JobState::Scheduled);
    assert_eq!(job.misfire, Misfire::Skip);
    assert_eq!(job.next_run_at, Some(T));
    assert_eq!(job.created_at, job.updated_at);
    assert!((job.created_at - before).abs() < 60.0, "{}", job.created_at);
    assert_eq!(job.last_run_at, None);
    assert_eq!(job.last_status, None);
    assert_eq!(job.last_error, None);
    assert_eq!(f.job("news").await.unwrap(), Some(job));
    assert_eq!(f.job("nothing").await.unwrap(), None);
}

async fn a_job_without_a_first_run_is_created_completed<S: Backend + CronStore>(f: Fixture<S>) {
    let mut spec = new_job(JOB, "once", None);
    spec.prompt = None;
    spec.skills = Vec::new();
    spec.origin = None;
    spec.repeat = None;
    f.create_job(spec).await.unwrap();
    let job = load(&*f, JOB).await;
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(job.next_run_at, None);
    assert_eq!(job.prompt, None);
    assert!(job.skills.is_empty());
    assert_eq!(job.origin, None);
    assert_eq!(job.repeat, None);
    assert!(f.due_jobs(i64::MAX, 10).await.unwrap().is_empty());
}

async fn ids_and_names_are_unique_and_ids_are_safe<S: Backend + CronStore>(f: Fixture<S>) {
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    let err = f
        .create_job(new_job("0123456789ab", "news", Some(T)))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    assert!(err.to_string().contains("news"), "{err}");
    let err = f
        .create_job(new_job(JOB, "other", Some(T)))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    // An id names the job's output folder: nothing that escapes it.
    let err = f
        .create_job(new_job("../escape", "escape", Some(T)))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidId(_)), "{err}");
    assert_eq!(f.jobs().await.unwrap().len(), 1);
}

async fn an_id_wins_over_a_name<S: Backend + CronStore>(f: Fixture<S>) {
    // A job named like another's id: looking up that id finds the other.
    f.create_job(new_job("aaaaaaaaaaaa", "bbbbbbbbbbbb", Some(T)))
        .await
        .unwrap();
    f.create_job(new_job("bbbbbbbbbbbb", "second", Some(T)))
        .await
        .unwrap();
    assert_eq!(load(&*f, "bbbbbbbbbbbb").await.name, "second");
    assert_eq!(load(&*f, "aaaaaaaaaaaa").await.name, "bbbbbbbbbbbb");
    assert_eq!(load(&*f, "second").await.id, "bbbbbbbbbbbb");
}

async fn jobs_are_listed_oldest_first<S: Backend + CronStore>(f: Fixture<S>) {
    for (id, name) in [
        ("cccccccccccc", "c"),
        ("aaaaaaaaaaaa", "a"),
        ("bbbbbbbbbbbb", "b"),
    ] {
        f.create_job(new_job(id, name, Some(T))).await.unwrap();
    }
    // b oldest; a and c created at the same time, so by id.
    f.execute("UPDATE cron_jobs SET created_at = 1000 WHERE id = 'bbbbbbbbbbbb'")
        .await;
    f.execute("UPDATE cron_jobs SET created_at = 2000 WHERE id <> 'bbbbbbbbbbbb'")
        .await;
    let names: Vec<String> = f
        .jobs()
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.name)
        .collect();
    assert_eq!(names, ["b", "a", "c"]);
}

async fn an_update_writes_the_editable_fields_only<S: Backend + CronStore>(f: Fixture<S>) {
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    f.create_job(new_job("0123456789ab", "taken", Some(T)))
        .await
        .unwrap();
    assert!(
        f.claim_occurrence(scheduled(JOB, T, Some(T + 3600)))
            .await
            .unwrap()
    );
    f.finish_occurrence(JOB, T, ended(OccurrenceStatus::Ok))
        .await
        .unwrap();
    let before = load(&*f, JOB).await;
    // Age the stamp, so the update shows however fast the clock reads.
    f.execute(&format!(
        "UPDATE cron_jobs SET updated_at = updated_at - 100 WHERE id = '{JOB}'"
    ))
    .await;

    let mut edited = before.clone();
    edited.name = "headlines".to_owned();
    edited.prompt = None;
    edited.skills = vec!["rss".to_owned()];
    edited.schedule = "0 9 * * *".to_owned();
    edited.deliver = vec!["local".to_owned()];
    edited.origin = None;
    edited.repeat = None;
    edited.misfire = Misfire::RunOnce;
    edited.state = JobState::Paused;
    edited.next_run_at = Some(T + 7200);
    // The run record is the scheduler's: these are ignored.
    edited.completed = 99;
    edited.last_run_at = None;
    edited.last_status = None;
    edited.last_error = Some("made up".to_owned());
    edited.created_at = 0.0;
    assert!(f.update_job(&edited).await.unwrap());

    let after = load(&*f, JOB).await;
    assert_eq!(after.name, "headlines");
    assert_eq!(after.prompt, None);
    assert_eq!(after.skills, ["rss"]);
    assert_eq!(after.schedule, "0 9 * * *");
    assert_eq!(after.deliver, ["local"]);
    assert_eq!(after.origin, None);
    assert_eq!(after.repeat, None);
    assert_eq!(after.misfire, Misfire::RunOnce);
    assert_eq!(after.state, JobState::Paused);
    assert_eq!(after.next_run_at, Some(T + 7200));
    assert_eq!(after.completed, 1);
    assert_eq!(after.last_run_at, before.last_run_at);
    assert_eq!(after.last_status, Some(OccurrenceStatus::Ok));
    assert_eq!(after.last_error, None);
    assert_eq!(after.created_at, before.created_at);
    assert!(after.updated_at >= before.updated_at);

    // A name another job holds is refused; a job that is gone is reported.
    edited.name = "taken".to_owned();
    let err = f.update_job(&edited).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    assert_eq!(load(&*f, JOB).await.name, "headlines");
    edited.id = "ffffffffffff".to_owned();
    edited.name = "ghost".to_owned();
    assert!(!f.update_job(&edited).await.unwrap());
}

/// An edit read before a scheduler's claim and written after it keeps the
/// claim's advance: the job is not put back on a run already taken, which
/// no claim could ever take again.
async fn an_edit_made_on_a_copy_read_before_a_claim_keeps_the_claims_advance<
    S: Backend + CronStore,
>(
    f: Fixture<S>,
) {
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    let stale = load(&*f, JOB).await;
    assert!(
        f.claim_occurrence(scheduled(JOB, T, Some(T + 60)))
            .await
            .unwrap()
    );
    let mut edited = stale.clone();
    edited.name = "headlines".to_owned();
    assert!(f.update_job(&edited).await.unwrap());
    let after = load(&*f, JOB).await;
    assert_eq!(after.name, "headlines");
    assert_eq!(after.next_run_at, Some(T + 60));
    assert_eq!(after.state, JobState::Scheduled);
    // And the next run is claimed as usual.
    assert!(
        f.claim_occurrence(scheduled(JOB, T + 60, Some(T + 120)))
            .await
            .unwrap()
    );

    // The last run completed the job: a stale edit does not bring back a
    // scheduled state with a run already taken.
    assert!(
        f.claim_occurrence(scheduled(JOB, T + 120, None))
            .await
            .unwrap()
    );
    let done = load(&*f, JOB).await;
    assert_eq!(done.state, JobState::Completed);
    let mut late = done.clone();
    late.state = JobState::Scheduled;
    late.next_run_at = Some(T + 120);
    assert!(f.update_job(&late).await.unwrap());
    let after = load(&*f, JOB).await;
    assert_eq!(
        (after.state, after.next_run_at),
        (JobState::Completed, None)
    );
    // A deliberate new time is written.
    late.next_run_at = Some(T + 3600);
    assert!(f.update_job(&late).await.unwrap());
    let after = load(&*f, JOB).await;
    assert_eq!(
        (after.state, after.next_run_at),
        (JobState::Scheduled, Some(T + 3600))
    );
}

async fn deleting_a_job_deletes_its_occurrences<S: Backend + CronStore>(f: Fixture<S>) {
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    f.create_job(new_job("0123456789ab", "kept", Some(T)))
        .await
        .unwrap();
    assert!(
        f.claim_occurrence(scheduled(JOB, T, Some(T + 60)))
            .await
            .unwrap()
    );
    assert!(f.claim_occurrence(manual(JOB, T + 1)).await.unwrap());
    assert!(f.claim_occurrence(manual("0123456789ab", T)).await.unwrap());
    assert!(f.delete_job(JOB).await.unwrap());
    assert_eq!(f.job(JOB).await.unwrap(), None);
    assert!(f.occurrences(JOB, 10).await.unwrap().is_empty());
    assert_eq!(
        f.query_f64(&format!(
            "SELECT COUNT(*) FROM cron_occurrences WHERE job_id = '{JOB}'"
        ))
        .await,
        Some(0.0)
    );
    assert!(!f.delete_job(JOB).await.unwrap());
    // The other job and its record are untouched.
    assert_eq!(f.occurrences("0123456789ab", 10).await.unwrap().len(), 1);
}

async fn due_jobs_are_the_scheduled_ones_whose_time_has_come<S: Backend + CronStore>(
    f: Fixture<S>,
) {
    f.create_job(new_job("000000000002", "later", Some(T + 10)))
        .await
        .unwrap();
    f.create_job(new_job("000000000001", "first", Some(T)))
        .await
        .unwrap();
    f.create_job(new_job("000000000003", "tie", Some(T + 10)))
        .await
        .unwrap();
    f.create_job(new_job("000000000004", "future", Some(T + 100)))
        .await
        .unwrap();
    f.create_job(new_job("000000000005", "done", None))
        .await
        .unwrap();
    f.create_job(new_job("000000000006", "paused", Some(T - 5)))
        .await
        .unwrap();
    let mut paused = load(&*f, "000000000006").await;
    paused.state = JobState::Paused;
    assert!(f.update_job(&paused).await.unwrap());

    let names = |jobs: Vec<CronJob>| jobs.into_iter().map(|j| j.name).collect::<Vec<_>>();
    // Earliest first, ties by id; the time itself counts as due.
    assert_eq!(
        names(f.due_jobs(T + 10, 10).await.unwrap()),
        ["first", "later", "tie"]
    );
    assert_eq!(names(f.due_jobs(T + 10, 1).await.unwrap()), ["first"]);
    assert!(f.due_jobs(T - 1, 10).await.unwrap().is_empty());
    assert_eq!(f.due_jobs(i64::MAX, 10).await.unwrap().len(), 4);
}

async fn a_scheduled_claim_moves_the_job_on_and_counts<S: Backend + CronStore>(f: Fixture<S>) {
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    assert!(
        f.claim_occurrence(scheduled(JOB, T, Some(T + 3600)))
            .await
            .unwrap()
    );
    let job = load(&*f, JOB).await;
    assert_eq!(job.next_run_at, Some(T + 3600));
    assert_eq!(job.completed, 1);
    assert_eq!(job.state, JobState::Scheduled);

    let runs = f.occurrences(JOB, 10).await.unwrap();
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    assert_eq!(run.job_id, JOB);
    assert_eq!(run.scheduled_at, T);
    assert_eq!(run.trigger, Trigger::Schedule);
    assert_eq!(run.status, OccurrenceStatus::Running);
    assert_eq!(run.session_id.as_deref(), Some(&*format!("cron_{JOB}_{T}")));
    assert_eq!(run.finished_at, None);
    assert_eq!(run.error, None);

    // The same claim again: the job has moved on, so nothing changes.
    assert!(
        !f.claim_occurrence(scheduled(JOB, T, Some(T + 3600)))
            .await
            .unwrap()
    );
    assert_eq!(load(&*f, JOB).await, job);
    assert_eq!(f.occurrences(JOB, 10).await.unwrap(), runs);
}

async fn the_last_claim_completes_the_job<S: Backend + CronStore>(f: Fixture<S>) {
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    assert!(f.claim_occurrence(scheduled(JOB, T, None)).await.unwrap());
    let job = load(&*f, JOB).await;
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(job.next_run_at, None);
    assert_eq!(job.completed, 1);
    assert!(f.due_jobs(i64::MAX, 10).await.unwrap().is_empty());
}

async fn a_skipped_occurrence_is_recorded_finished_without_counting<S: Backend + CronStore>(
    f: Fixture<S>,
) {
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    let mut claim = scheduled(JOB, T, Some(T + 3600));
    claim.status = OccurrenceStatus::Missed;
    claim.session_id = None;
    if let Some(advance) = claim.advance.as_mut() {
        advance.counts = false;
    }
    assert!(f.claim_occurrence(claim).await.unwrap());
    let job = load(&*f, JOB).await;
    assert_eq!(job.completed, 0);
    assert_eq!(job.next_run_at, Some(T + 3600));
    let runs = f.occurrences(JOB, 10).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, OccurrenceStatus::Missed);
    assert_eq!(runs[0].session_id, None);
    // Nothing runs, so it ends as it starts.
    assert_eq!(runs[0].finished_at, Some(runs[0].started_at));
}

async fn a_claim_on_a_taken_occurrence_changes_nothing<S: Backend + CronStore>(f: Fixture<S>) {
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    // Someone ran the job by hand in the very second it was due.
    assert!(f.claim_occurrence(manual(JOB, T)).await.unwrap());
    let before = load(&*f, JOB).await;
    // The scheduler's claim loses, and its move of the job is undone.
    assert!(
        !f.claim_occurrence(scheduled(JOB, T, Some(T + 3600)))
            .await
            .unwrap()
    );
    assert_eq!(load(&*f, JOB).await, before);
    let runs = f.occurrences(JOB, 10).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].trigger, Trigger::Manual);
}

async fn manual_runs_leave_the_schedule_alone<S: Backend + CronStore>(f: Fixture<S>) {
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    let before = load(&*f, JOB).await;
    assert!(f.claim_occurrence(manual(JOB, T + 5)).await.unwrap());
    assert_eq!(load(&*f, JOB).await, before);
    // One run per second.
    assert!(!f.claim_occurrence(manual(JOB, T + 5)).await.unwrap());
    assert!(f.claim_occurrence(manual(JOB, T + 6)).await.unwrap());
    let runs = f.occurrences(JOB, 10).await.unwrap();
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().all(|r| r.trigger == Trigger::Manual));
    // A paused job may still be run by hand.
    let mut paused = before.clone();
    paused.state = JobState::Paused;
    assert!(f.update_job(&paused).await.unwrap());
    assert!(f.claim_occurrence(manual(JOB, T + 7)).await.unwrap());
    // A job that is gone cannot be run at all.
    let ghost = "ffffffffffff";
    assert!(!f.claim_occurrence(manual(ghost, T)).await.unwrap());
    assert!(
        !f.claim_occurrence(scheduled(ghost, T, Some(T + 60)))
            .await
            .unwrap()
    );
    assert!(f.occurrences(ghost, 10).await.unwrap().is_empty());
}

async fn a_paused_job_is_not_claimed_on_schedule<S: Backend + CronStore>(f: Fixture<S>) {
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    let mut job = load(&*f, JOB).await;
    job.state = JobState::Paused;
    assert!(f.update_job(&job).await.unwrap());
    assert!(
        !f.claim_occurrence(scheduled(JOB, T, Some(T + 60)))
            .await
            .unwrap()
    );
    let after = load(&*f, JOB).await;
    assert_eq!((after.next_run_at, after.completed), (Some(T), 0));
    assert!(f.occurrences(JOB, 10).await.unwrap().is_empty());
}

async fn finishing_records_the_run_on_the_occurrence_and_the_job<S: Backend + CronStore>(
    f: Fixture<S>,
) {
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    assert!(
        f.claim_occurrence(scheduled(JOB, T, Some(T + 60)))
            .await
            .unwrap()
    );
    let long = "é".repeat(3000);
    f.finish_occurrence(
        JOB,
        T,
        OccurrenceEnd {
            status: OccurrenceStatus::Failed,
            error: Some(long.clone()),
            output_path: Some("/cron/output/a1b2c3d4e5f6/run.md".to_owned()),
            delivery_error: Some("telegram: 403".to_owned()),
        },
    )
    .await
    .unwrap();
    let run = f.occurrences(JOB, 1).await.unwrap().remove(0);
    assert_eq!(run.status, OccurrenceStatus::Failed);
    let finished = run.finished_at.expect("finished");
    assert!(finished >= run.started_at);
    // Error texts are kept to 2,000 chars, cut on a char boundary.
    let kept: String = long.chars().take(2000).collect();
    assert_eq!(run.error.as_deref(), Some(&*kept));
    assert_eq!(
        run.output_path.as_deref(),
        Some("/cron/output/a1b2c3d4e5f6/run.md")
    );
    assert_eq!(run.delivery_error.as_deref(), Some("telegram: 403"));
    let job = load(&*f, JOB).await;
    assert_eq!(job.last_status, Some(OccurrenceStatus::Failed));
    assert_eq!(job.last_run_at, Some(finished));
    assert_eq!(job.last_error.as_deref(), Some(&*kept));

    // Without a run error, the delivery error is the job's last error.
    assert!(
        f.claim_occurrence(scheduled(JOB, T + 60, Some(T + 120)))
            .await
            .unwrap()
    );
    let mut end = ended(OccurrenceStatus::Ok);
    end.delivery_error = Some("slack: channel_not_found".to_owned());
    f.finish_occurrence(JOB, T + 60, end).await.unwrap();
    let job = load(&*f, JOB).await;
    assert_eq!(job.last_status, Some(OccurrenceStatus::Ok));
    assert_eq!(job.last_error.as_deref(), Some("slack: channel_not_found"));
    // And a clean run clears it.
    assert!(
        f.claim_occurrence(scheduled(JOB, T + 120, Some(T + 180)))
            .await
            .unwrap()
    );
    f.finish_occurrence(JOB, T + 120, ended(OccurrenceStatus::Silent))
        .await
        .unwrap();
    let job = load(&*f, JOB).await;
    assert_eq!(job.last_status, Some(OccurrenceStatus::Silent));
    assert_eq!(job.last_error, None);
}

async fn occurrences_are_listed_newest_first_and_pruned_to_the_newest<S: Backend + CronStore>(
    f: Fixture<S>,
) {
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    f.create_job(new_job("0123456789ab", "other", Some(T)))
        .await
        .unwrap();
    for at in [T + 2, T, T + 4, T + 1, T + 3] {
        assert!(f.claim_occurrence(manual(JOB, at)).await.unwrap());
    }
    assert!(f.claim_occurrence(manual("0123456789ab", T)).await.unwrap());
    let times = |runs: Vec<talaria_store::Occurrence>| {
        runs.into_iter().map(|r| r.scheduled_at).collect::<Vec<_>>()
    };
    assert_eq!(
        times(f.occurrences(JOB, 3).await.unwrap()),
        [T + 4, T + 3, T + 2]
    );
    assert_eq!(f.prune_occurrences(JOB, 2).await.unwrap(), 3);
    assert_eq!(times(f.occurrences(JOB, 10).await.unwrap()), [T + 4, T + 3]);
    assert_eq!(f.prune_occurrences(JOB, 2).await.unwrap(), 0);
    assert_eq!(f.occurrences("0123456789ab", 10).await.unwrap().len(), 1);
    assert_eq!(f.prune_occurrences(JOB, 0).await.unwrap(), 2);
    assert!(f.occurrences(JOB, 10).await.unwrap().is_empty());
}

async fn recent_occurrences_of_every_job_are_listed_latest_started_first<S: Backend + CronStore>(
    f: Fixture<S>,
) {
    const OTHER: &str = "0123456789ab";
    assert!(f.recent_occurrences(10).await.unwrap().is_empty());
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    f.create_job(new_job(OTHER, "other", Some(T)))
        .await
        .unwrap();
    assert!(
        f.claim_occurrence(scheduled(JOB, T, Some(T + 3600)))
            .await
            .unwrap()
    );
    f.finish_occurrence(JOB, T, ended(OccurrenceStatus::Failed))
        .await
        .unwrap();
    for at in [T + 1, T + 2] {
        assert!(f.claim_occurrence(manual(OTHER, at)).await.unwrap());
    }
    assert!(f.claim_occurrence(manual(JOB, T + 3)).await.unwrap());
    // Started in this order, whatever they were due: news's T, then
    // other's T + 2 and T + 1 together, then news's T + 3.
    for (job, at, started) in [
        (JOB, T, 100),
        (OTHER, T + 1, 200),
        (OTHER, T + 2, 200),
        (JOB, T + 3, 300),
    ] {
        f.execute(&format!(
            "UPDATE cron_occurrences SET started_at = {started} \
             WHERE job_id = '{job}' AND scheduled_at = {at}"
        ))
        .await;
    }
    let runs = f.recent_occurrences(3).await.unwrap();
    let seen: Vec<(&str, i64)> = runs
        .iter()
        .map(|r| (r.job_id.as_str(), r.scheduled_at))
        .collect();
    assert_eq!(seen, [(JOB, T + 3), (OTHER, T + 2), (OTHER, T + 1)]);
    assert_eq!(runs[0].trigger, Trigger::Manual);
    assert_eq!(runs[0].status, OccurrenceStatus::Running);
    let all = f.recent_occurrences(10).await.unwrap();
    assert_eq!(all.len(), 4);
    assert_eq!(all[3].job_id, JOB);
    assert_eq!(all[3].status, OccurrenceStatus::Failed);
    assert_eq!(all[3].trigger, Trigger::Schedule);
    assert!(all[3].finished_at.is_some());
    assert!(f.recent_occurrences(0).await.unwrap().is_empty());
}

async fn stale_running_occurrences_are_interrupted<S: Backend + CronStore>(f: Fixture<S>) {
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    for at in [T, T + 1, T + 2] {
        assert!(f.claim_occurrence(manual(JOB, at)).await.unwrap());
    }
    f.finish_occurrence(JOB, T + 2, ended(OccurrenceStatus::Ok))
        .await
        .unwrap();
    // The first run and the finished one started long ago.
    f.execute(&format!(
        "UPDATE cron_occurrences SET started_at = started_at - 1000 \
         WHERE scheduled_at IN ({T}, {})",
        T + 2
    ))
    .await;
    let cutoff = talaria_core::unix_now() - 500.0;
    assert_eq!(f.interrupt_stale_occurrences(cutoff).await.unwrap(), 1);
    let runs = f.occurrences(JOB, 10).await.unwrap();
    let status = |at: i64| runs.iter().find(|r| r.scheduled_at == at).unwrap();
    assert_eq!(status(T).status, OccurrenceStatus::Interrupted);
    assert!(status(T).finished_at.is_some());
    assert!(status(T).error.as_deref().unwrap_or("").contains("stopped"));
    assert_eq!(status(T + 1).status, OccurrenceStatus::Running);
    assert_eq!(status(T + 2).status, OccurrenceStatus::Ok);
    assert_eq!(f.interrupt_stale_occurrences(cutoff).await.unwrap(), 0);
}

async fn an_unreadable_job_fails_the_read_naming_it<S: Backend + CronStore>(f: Fixture<S>) {
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    f.execute(&format!(
        "UPDATE cron_jobs SET deliver = 'not json' WHERE id = '{JOB}'"
    ))
    .await;
    let err = f.job(JOB).await.unwrap_err();
    assert!(matches!(err, StoreError::Database(_)), "{err}");
    assert!(err.to_string().contains(JOB), "{err}");
    assert!(f.jobs().await.is_err());
}

/// Two nodes' schedulers, two claimers on each, racing for every
/// occurrence of a job: each is claimed once, and the job moves one step
/// per occurrence.
async fn racing_schedulers_claim_each_occurrence_once<S: Backend + CronStore>(f: Fixture<S>) {
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    let mut spec = load(&*f, JOB).await;
    spec.repeat = None;
    assert!(f.update_job(&spec).await.unwrap());
    let handles: [Arc<S>; 2] = [f.store.clone(), Arc::new(f.reopen().await)];
    let rounds = 20;
    for round in 0..rounds {
        let at = T + 60 * round;
        let barrier = Arc::new(Barrier::new(4));
        let claimers: Vec<_> = (0..4)
            .map(|i| {
                let (store, barrier) = (handles[i % 2].clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .claim_occurrence(scheduled(JOB, at, Some(at + 60)))
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut won = 0;
        for claimer in claimers {
            won += usize::from(claimer.await.unwrap());
        }
        assert_eq!(won, 1, "round {round}");
    }
    let job = load(&*f, JOB).await;
    assert_eq!(job.next_run_at, Some(T + 60 * rounds));
    assert_eq!(i64::from(job.completed), rounds);
    assert_eq!(
        f.occurrences(JOB, 100).await.unwrap().len(),
        usize::try_from(rounds).unwrap()
    );
}

/// Scheduled and manual claims of one occurrence racing on two nodes:
/// exactly one wins, and when a manual run wins, no scheduler's move of
/// the job survives.
async fn racing_manual_and_scheduled_claims_agree<S: Backend + CronStore>(f: Fixture<S>) {
    f.create_job(new_job(JOB, "news", Some(T))).await.unwrap();
    let mut spec = load(&*f, JOB).await;
    spec.repeat = None;
    assert!(f.update_job(&spec).await.unwrap());
    let handles: [Arc<S>; 2] = [f.store.clone(), Arc::new(f.reopen().await)];
    let mut due = T;
    let mut counted = 0;
    for round in 0..20 {
        let barrier = Arc::new(Barrier::new(4));
        let claimers: Vec<_> = (0..4)
            .map(|i| {
                let (store, barrier) = (handles[i % 2].clone(), barrier.clone());
                let claim = if i < 2 {
                    scheduled(JOB, due, Some(due + 60))
                } else {
                    manual(JOB, due)
                };
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.claim_occurrence(claim).await.unwrap()
                })
            })
            .collect();
        let mut wins = Vec::new();
        for claimer in claimers {
            wins.push(claimer.await.unwrap());
        }
        assert_eq!(wins.iter().filter(|w| **w).count(), 1, "round {round}");
        let run = f
            .occurrences(JOB, 1)
            .await
            .unwrap()
            .into_iter()
            .find(|r| r.scheduled_at == due)
            .expect("the occurrence is recorded");
        let job = load(&*f, JOB).await;
        if wins[0] || wins[1] {
            assert_eq!(run.trigger, Trigger::Schedule, "round {round}");
            counted += 1;
            due += 60;
        } else {
            assert_eq!(run.trigger, Trigger::Manual, "round {round}");
            // The job still waits for this time; the next round's manual
            // runs take the next second, which the schedule does not use.
            due += 1;
            let mut moved = job.clone();
            moved.next_run_at = Some(due);
            assert!(f.update_job(&moved).await.unwrap());
        }
        assert_eq!(job.completed, counted, "round {round}");
    }
}

/// A manual run and a delete racing on two nodes: neither fails, and no
/// record of the run outlives the job.
async fn a_claim_racing_a_delete_leaves_nothing_behind<S: Backend + CronStore>(f: Fixture<S>) {
    let other = Arc::new(f.reopen().await);
    for round in 0..20 {
        let id = format!("{round:012x}");
        f.create_job(new_job(&id, &format!("job{round}"), Some(T)))
            .await
            .unwrap();
        let barrier = Arc::new(Barrier::new(2));
        let claimer = {
            let (store, barrier, id) = (f.store.clone(), barrier.clone(), id.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.claim_occurrence(manual(&id, T)).await
            })
        };
        let deleter = {
            let (store, barrier, id) = (other.clone(), barrier.clone(), id.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.delete_job(&id).await
            })
        };
        claimer.await.unwrap().unwrap();
        assert!(deleter.await.unwrap().unwrap(), "round {round}");
        assert_eq!(f.job(&id).await.unwrap(), None);
        assert_eq!(
            f.query_f64(&format!(
                "SELECT COUNT(*) FROM cron_occurrences WHERE job_id = '{id}'"
            ))
            .await,
            Some(0.0),
            "round {round}"
        );
    }
}

contract_tests!(
    a_job_round_trips_and_is_found_by_id_or_name,
    a_job_without_a_first_run_is_created_completed,
    ids_and_names_are_unique_and_ids_are_safe,
    an_id_wins_over_a_name,
    jobs_are_listed_oldest_first,
    an_update_writes_the_editable_fields_only,
    an_edit_made_on_a_copy_read_before_a_claim_keeps_the_claims_advance,
    deleting_a_job_deletes_its_occurrences,
    due_jobs_are_the_scheduled_ones_whose_time_has_come,
    a_scheduled_claim_moves_the_job_on_and_counts,
    the_last_claim_completes_the_job,
    a_skipped_occurrence_is_recorded_finished_without_counting,
    a_claim_on_a_taken_occurrence_changes_nothing,
    manual_runs_leave_the_schedule_alone,
    a_paused_job_is_not_claimed_on_schedule,
    finishing_records_the_run_on_the_occurrence_and_the_job,
    occurrences_are_listed_newest_first_and_pruned_to_the_newest,
    recent_occurrences_of_every_job_are_listed_latest_started_first,
    stale_running_occurrences_are_interrupted,
    an_unreadable_job_fails_the_read_naming_it,
    racing_schedulers_claim_each_occurrence_once,
    racing_manual_and_scheduled_claims_agree,
    a_claim_racing_a_delete_leaves_nothing_behind,
);
