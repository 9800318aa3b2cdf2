//! How much of W2's gap through the broker is the AMQP client's own cost per delivery? The W2
//! bench (`paybus-lab bench confirm-withdrawal --pin-broker`) puts the consuming process's CPU
//! through the broker about 40 µs per message above direct, on the core it shares with the
//! database (docs/benchmarks.md).
//!
//! This experiment measures the client library's part: one process consumes a quorum queue with
//! lapin (paybus's) or amqprs (the candidate), acking in runs of 16 as paybus does, while a
//! child publishes at a steady rate (W2's by default), so deliveries trickle in as in the bench.
//! Each round runs both clients, alternating which goes first, and prints each one's CPU per
//! delivery, their ratio, then the medians. `--pin`: this process on CPU 1, the publisher on
//! CPU 0 (the bench's pinned layout minus the database).
//! ```text
//! cargo run --release --manifest-path tests/lab/amqp-clients/Cargo.toml -- \
//!     [--messages 15000] [--rate 3000] [--rounds 3] [--pin] [--url amqp://…]
//! ```

use std::{
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use futures_util::StreamExt;
use lapin::{
    BasicProperties, Connection, ConnectionProperties,
    options::{
        BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
        ConfirmSelectOptions, QueueDeclareOptions, QueuePurgeOptions,
    },
    types::{AMQPValue, FieldTable},
};

const QUEUE: &str = "paybus.lab.amqp-clients";
/// The channel prefetch paybus gives a batching function (twice `PAYBUS_PREFETCH`'s default
/// of 64: `bus/consumer.rs`), and its acks in runs of a batch.
const PREFETCH: u16 = 128;
const ACK_EVERY: usize = 16;
/// Linux's USER_HZ.
const TICKS_PER_SECOND: f64 = 100.0;

struct Options {
    messages: usize,
    rate: u64,
    rounds: usize,
    pin: bool,
    url: String,
}

fn options(mut args: impl Iterator<Item = String>) -> anyhow::Result<Options> {
    let mut options = Options {
        messages: 15_000,
        rate: 3_000,
        rounds: 3,
        pin: false,
        url: std::env::var("PAYBUS_AMQP_URL")
            .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5682/%2f".to_owned()),
    };
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--messages" => options.messages = value()?.parse().context("--messages")?,
            "--rate" => options.rate = value()?.parse().context("--rate")?,
            "--rounds" => options.rounds = value()?.parse().context("--rounds")?,
            "--url" => options.url = value()?,
            "--pin" => options.pin = true,
            other => bail!("unknown argument {other} (see the doc comment of src/main.rs)"),
        }
    }
    if options.messages == 0 || options.rate == 0 || options.rounds == 0 {
        bail!("--messages, --rate and --rounds must be at least 1");
    }
    Ok(options)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("publish") {
        let options = options(args.skip(1))?;
        return publish(&options).await;
    }
    let options = options(args)?;
    if options.pin {
        taskset("1", std::process::id())?;
    }
    prepare(&options.url).await?;
    let mut ratios = Vec::new();
    for round in 0..options.rounds {
        let order = if round % 2 == 0 {
            ["lapin", "amqprs"]
        } else {
            ["amqprs", "lapin"]
        };
        let mut per_delivery = [0.0; 2];
        for client in order {
            let (rate, micros) = consume_while_publishing(client, &options).await?;
            println!(
                "round {} {client:<6}: {rate:>6.0} deliveries/s, {micros:>5.1} µs of this process's CPU per delivery",
                round + 1
            );
            per_delivery[usize::from(client == "amqprs")] = micros;
        }
        let ratio = per_delivery[1] / per_delivery[0];
        println!("round {}: amqprs / lapin {ratio:.2}", round + 1);
        ratios.push((per_delivery, ratio));
    }
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    println!(
        "medians of {} rounds: lapin {:.1} µs, amqprs {:.1} µs per delivery; amqprs / lapin {:.2}",
        ratios.len(),
        median(ratios.iter().map(|(p, _)| p[0]).collect()),
        median(ratios.iter().map(|(p, _)| p[1]).collect()),
        median(ratios.iter().map(|(_, r)| *r).collect()),
    );
    Ok(())
}

/// The queue, durable and quorum like paybus's function queues, empty.
async fn prepare(url: &str) -> anyhow::Result<()> {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .context("connecting to the broker")?;
    let channel = connection.create_channel().await?;
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    channel
        .queue_declare(
            QUEUE.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            arguments,
        )
        .await?;
    channel
        .queue_purge(QUEUE.into(), QueuePurgeOptions::default())
        .await?;
    connection.close(200, "prepared".into()).await?;
    Ok(())
}

/// Consumes `options.messages` deliveries with `client` while a child process publishes them;
/// the delivery rate and this process's CPU per delivery, from the first delivery to the last
/// ack.
async fn consume_while_publishing(client: &str, options: &Options) -> anyhow::Result<(f64, f64)> {
    let mut publisher = if options.pin {
        let mut command = Command::new("taskset");
        command
            .args(["--cpu-list", "0"])
            .arg(std::env::current_exe()?);
        command
    } else {
        Command::new(std::env::current_exe()?)
    };
    publisher.args([
        "publish",
        "--messages",
        &options.messages.to_string(),
        "--rate",
        &options.rate.to_string(),
        "--url",
        &options.url,
    ]);
    let consumed = async {
        match client {
            "lapin" => consume_with_lapin(&options.url, options.messages).await,
            _ => consume_with_amqprs(&options.url, options.messages).await,
        }
    };
    let mut child = publisher.spawn().context("starting the publisher")?;
    let consumed = consumed.await;
    let status = child.wait()?;
    if !status.success() {
        bail!("the publisher failed: {status}");
    }
    let (elapsed, ticks) = consumed?;
    Ok((
        options.messages as f64 / elapsed.as_secs_f64(),
        ticks as f64 * 1e6 / TICKS_PER_SECOND / options.messages as f64,
    ))
}

/// Publishes `options.messages` at about `options.rate` per second, in bursts of 16 (a batch's
/// worth), each like a paybus event: 300 bytes, persistent, a message id and a shard key.
async fn publish(options: &Options) -> anyhow::Result<()> {
    let connection = Connection::connect(&options.url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let body = vec![b'x'; 300];
    let burst = 16;
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 * burst / options.rate));
    let mut sent = 0;
    while sent < options.messages {
        tick.tick().await;
        let mut confirms = Vec::new();
        for _ in 0..burst.min((options.messages - sent) as u64) {
            let mut headers = FieldTable::default();
            headers.insert(
                "x-paybus-shard-key".into(),
                AMQPValue::LongString(format!("withdrawal-{}", sent / 2).into()),
            );
            let properties = BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(format!("{sent:032}").into())
                .with_content_type("application/json".into())
                .with_headers(headers);
            confirms.push(
                channel
                    .basic_publish(
                        "".into(),
                        QUEUE.into(),
                        BasicPublishOptions::default(),
                        &body,
                        properties,
                    )
                    .await?,
            );
            sent += 1;
        }
        for confirm in confirms {
            confirm.await?;
        }
    }
    connection.close(200, "published".into()).await?;
    Ok(())
}

/// This process's CPU so far (user and system, every thread), in ticks.
fn cpu_ticks() -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("/proc/self/stat")?
        .1
        .split_whitespace()
        .collect();
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}

/// Started at the first delivery: (when, CPU ticks).
type Clock = Option<(Instant, u64)>;

fn lap(clock: Clock) -> anyhow::Result<(Duration, u64)> {
    let (started, ticks) = clock.context("nothing was delivered")?;
    Ok((started.elapsed(), cpu_ticks()? - ticks))
}

async fn consume_with_lapin(url: &str, messages: usize) -> anyhow::Result<(Duration, u64)> {
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let mut deliveries = channel
        .basic_consume(
            QUEUE.into(),
            "lapin".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let (mut clock, mut received, mut bytes) = (None, 0, 0);
    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery?;
        clock.get_or_insert_with(|| (Instant::now(), cpu_ticks().unwrap_or(0)));
        bytes += delivery.data.len() + delivery.properties.headers().iter().count();
        received += 1;
        if received % ACK_EVERY == 0 || received == messages {
            delivery
                .acker
                .ack(BasicAckOptions { multiple: true })
                .await?;
        }
        if received == messages {
            break;
        }
    }
    let lapped = lap(clock)?;
    anyhow::ensure!(
        bytes > 0 && received == messages,
        "lapin: {received} delivered"
    );
    connection.close(200, "consumed".into()).await?;
    Ok(lapped)
}

async fn consume_with_amqprs(url: &str, messages: usize) -> anyhow::Result<(Duration, u64)> {
    use amqprs::{
        channel::{BasicAckArguments, BasicConsumeArguments, BasicQosArguments},
        connection::{Connection, OpenConnectionArguments},
    };
    let url = url::Url::parse(url)?;
    let connection = Connection::open(&OpenConnectionArguments::new(
        url.host_str().unwrap_or("127.0.0.1"),
        url.port().unwrap_or(5672),
        url.username(),
        url.password().unwrap_or("guest"),
    ))
    .await?;
    let channel = connection.open_channel(None).await?;
    channel
        .basic_qos(BasicQosArguments::new(0, PREFETCH, false))
        .await?;
    let (_tag, mut deliveries) = channel
        .basic_consume_rx(
            BasicConsumeArguments::new(QUEUE, "amqprs")
                .manual_ack(true)
                .finish(),
        )
        .await?;
    let (mut clock, mut received, mut bytes) = (None, 0, 0);
    while let Some(delivery) = deliveries.recv().await {
        clock.get_or_insert_with(|| (Instant::now(), cpu_ticks().unwrap_or(0)));
        let tag = delivery
            .deliver
            .context("a delivery without its method")?
            .delivery_tag();
        bytes += delivery.content.map_or(0, |body| body.len())
            + delivery
                .basic_properties
                .and_then(|properties| properties.headers().map(|h| h.as_ref().len()))
                .unwrap_or(0);
        received += 1;
        if received % ACK_EVERY == 0 || received == messages {
            channel.basic_ack(BasicAckArguments::new(tag, true)).await?;
        }
        if received == messages {
            break;
        }
    }
    let lapped = lap(clock)?;
    anyhow::ensure!(
        bytes > 0 && received == messages,
        "amqprs: {received} delivered"
    );
    channel.close().await?;
    connection.close().await?;
    Ok(lapped)
}

fn taskset(cpus: &str, pid: u32) -> anyhow::Result<()> {
    let status = Command::new("taskset")
        .args(["--all-tasks", "--cpu-list", "--pid", cpus, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .context("running taskset (util-linux)")?;
    if !status.success() {
        bail!("taskset {cpus} {pid} failed: {status}");
    }
    Ok(())
}
