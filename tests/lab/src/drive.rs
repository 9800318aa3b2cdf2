//! Load as the benches and the chaos run send it: a number of items on a number of tasks.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

/// Runs `work(i)` for i in 0..count on `concurrency` tasks; the elapsed time.
pub(crate) async fn drive<F, Fut>(
    count: usize,
    concurrency: u16,
    work: F,
) -> anyhow::Result<Duration>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (next, work) = (next.clone(), work.clone());
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return anyhow::Ok(());
                }
                work(i).await?;
            }
        });
    }
    while let Some(joined) = workers.join_next().await {
        joined??;
    }
    Ok(started.elapsed())
}
