//! Every way a createTrade call can fail, against a real HTTP server (or a real socket that
//! misbehaves), classified into what it leaves behind at the quote service: not done (nothing
//! was sent, or the request was refused as such) or unknown (it may have traded).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::{net::SocketAddr, time::Duration};

use paybus_p2p::{
    QuoteConfig,
    quote::{Effect, Quote, QuoteClient, QuoteError, TradeRequest},
};
use paybus_testkit::dec;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpSocket, TcpStream},
};
use wiremock::{
    Mock, MockServer, ResponseTemplate,
    matchers::{method, path},
};

const TIMEOUT: Duration = Duration::from_millis(400);

fn client(base: &str) -> QuoteClient {
    QuoteClient::new(&QuoteConfig {
        url: Some(base.parse().unwrap()),
        timeout: TIMEOUT,
        connect_timeout: Duration::from_millis(200),
        ..QuoteConfig::default()
    })
    .unwrap()
    .unwrap()
}

fn quote() -> Quote {
    Quote {
        quote_id: "q-1".to_owned(),
        rate: dec("1391.5"),
        fee: dec("0.1"),
    }
}

async fn create_trade(base: &str) -> Result<paybus_p2p::quote::Trade, QuoteError> {
    client(base)
        .create_trade(
            &TradeRequest {
                quote_id: "q-1",
                currency: "USDT",
                amount: dec("25"),
                reference: "p2p-deposit-1",
                key: "p2p-deposit-1-fill-1",
            },
            &quote(),
        )
        .await
}

/// The effect of a createTrade against a wiremock server answering `response`.
async fn effect_of(response: ResponseTemplate) -> (Effect, QuoteError) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/trades"))
        .respond_with(response)
        .mount(&server)
        .await;
    let error = create_trade(&server.uri()).await.unwrap_err();
    (error.effect(), error)
}

/// A server that accepts connections and hands each to `serve`.
async fn raw_server<F, Fut>(serve: F) -> SocketAddr
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            serve(stream).await;
        }
    });
    address
}

/// Reads one whole HTTP request (headers and a Content-Length body).
async fn read_request(stream: &mut TcpStream) -> Vec<u8> {
    let mut request = Vec::new();
    let mut buffer = [0_u8; 4096];
    loop {
        let n = stream.read(&mut buffer).await.unwrap_or(0);
        if n == 0 {
            return request;
        }
        request.extend_from_slice(&buffer[..n]);
        let text = String::from_utf8_lossy(&request);
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if request.len() >= end + 4 + length {
                return request;
            }
        }
    }
}

/// Closes `stream` with a TCP reset (SO_LINGER 0) instead of a FIN.
fn reset(stream: TcpStream) {
    let std = stream.into_std().unwrap();
    socket2::SockRef::from(&std)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(std);
}

#[tokio::test]
async fn a_refused_connection_is_not_done() {
    // A port nobody listens on: bind one, note it, close it.
    let address = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let error = create_trade(&format!("http://{address}"))
        .await
        .unwrap_err();
    assert!(matches!(error, QuoteError::Connect { .. }), "{error:?}");
    assert_eq!(error.effect(), Effect::NotDone);
}

#[tokio::test]
async fn a_connect_timeout_before_anything_was_sent_is_not_done() {
    // A listener whose accept queue is full: the kernel drops new handshakes.
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let address = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        if let Ok(Ok(stream)) =
            tokio::time::timeout(Duration::from_millis(100), TcpStream::connect(address)).await
        {
            fillers.push(stream);
        }
    }
    let error = create_trade(&format!("http://{address}"))
        .await
        .unwrap_err();
    assert!(matches!(error, QuoteError::Connect { .. }), "{error:?}");
    assert_eq!(error.effect(), Effect::NotDone);
    drop((fillers, listener));
}

#[tokio::test]
async fn a_reset_before_the_request_was_read_is_unknown_because_nothing_proves_it() {
    // The server resets the connection as soon as it is accepted. From the client's side the
    // request may already be in the server's buffers: only a failure to connect proves it
    // was not sent.
    let address = raw_server(|stream| async move { reset(stream) }).await;
    let error = create_trade(&format!("http://{address}"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, QuoteError::Transport { .. }),
        "expected a transport failure, got {error:?}"
    );
    assert_eq!(error.effect(), Effect::Unknown);
}

#[tokio::test]
async fn a_reset_after_the_request_was_read_is_unknown() {
    let address = raw_server(|mut stream| async move {
        read_request(&mut stream).await;
        reset(stream);
    })
    .await;
    let error = create_trade(&format!("http://{address}"))
        .await
        .unwrap_err();
    assert!(matches!(error, QuoteError::Transport { .. }), "{error:?}");
    assert_eq!(error.effect(), Effect::Unknown);
}

#[tokio::test]
async fn a_timeout_after_the_request_was_read_is_unknown() {
    let address = raw_server(|mut stream| async move {
        read_request(&mut stream).await;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(stream);
        });
    })
    .await;
    let error = create_trade(&format!("http://{address}"))
        .await
        .unwrap_err();
    assert!(matches!(error, QuoteError::Timeout { .. }), "{error:?}");
    assert_eq!(error.effect(), Effect::Unknown);
}

#[tokio::test]
async fn a_timeout_while_the_answer_is_on_its_way_is_unknown() {
    // The service traded and starts answering, too late.
    let address = raw_server(|mut stream| async move {
        read_request(&mut stream).await;
        tokio::spawn(async move {
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n{\"trade_id\":")
                .await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
    })
    .await;
    let error = create_trade(&format!("http://{address}"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            QuoteError::Timeout { .. } | QuoteError::Transport { .. }
        ),
        "{error:?}"
    );
    assert_eq!(error.effect(), Effect::Unknown);
}

#[tokio::test]
async fn a_definitive_4xx_refusal_is_not_done() {
    for status in [400, 401, 403, 404, 422, 429] {
        let (effect, error) =
            effect_of(ResponseTemplate::new(status).set_body_string("quote expired")).await;
        assert_eq!(effect, Effect::NotDone, "{status}: {error}");
        assert!(
            matches!(error, QuoteError::Status { status: s, .. } if s == status),
            "{error:?}"
        );
    }
}

#[tokio::test]
async fn a_5xx_is_unknown() {
    for status in [500, 502, 503, 504] {
        let (effect, error) = effect_of(ResponseTemplate::new(status)).await;
        assert_eq!(effect, Effect::Unknown, "{status}: {error}");
    }
}

#[tokio::test]
async fn a_409_for_a_key_in_use_or_reused_with_another_amount_is_unknown() {
    let (effect, error) = effect_of(
        ResponseTemplate::new(409).set_body_string("idempotency key reused with another amount"),
    )
    .await;
    assert_eq!(effect, Effect::Unknown, "{error}");
    // 408 and 425 say nothing about the key either.
    for status in [408, 425] {
        assert_eq!(
            effect_of(ResponseTemplate::new(status)).await.0,
            Effect::Unknown
        );
    }
}

#[tokio::test]
async fn a_garbage_answer_is_unknown() {
    let (effect, error) =
        effect_of(ResponseTemplate::new(200).set_body_string("<html>gateway</html>")).await;
    assert!(matches!(error, QuoteError::Invalid { .. }), "{error:?}");
    assert_eq!(effect, Effect::Unknown);
}

#[tokio::test]
async fn a_trade_for_another_amount_is_unknown_not_settled() {
    let (effect, error) = effect_of(
        ResponseTemplate::new(200)
            .set_body_json(serde_json::json!({"trade_id": "t-9", "amount": "26"})),
    )
    .await;
    assert!(error.to_string().contains("is for 26, not 25"), "{error}");
    assert_eq!(effect, Effect::Unknown);
}

#[tokio::test]
async fn an_answer_carries_the_trades_own_terms_and_falls_back_to_the_quotes() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/trades"))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            serde_json::json!({"trade_id": "t-1", "amount": "25", "rate": "1400", "fee": "0.2"}),
        ))
        .mount(&server)
        .await;
    let trade = create_trade(&server.uri()).await.unwrap();
    assert_eq!(
        (trade.trade_id.as_str(), trade.rate, trade.fee),
        ("t-1", dec("1400"), dec("0.2"))
    );

    let older = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/trades"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(serde_json::json!({"trade_id": "t-2"})),
        )
        .mount(&older)
        .await;
    let trade = create_trade(&older.uri()).await.unwrap();
    assert_eq!((trade.rate, trade.fee), (dec("1391.5"), dec("0.1")));
}

#[tokio::test]
async fn any_failure_of_a_quote_is_not_done() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/quotes"))
        .respond_with(ResponseTemplate::new(503))
        .mount(&server)
        .await;
    let error = client(&server.uri())
        .quote(&paybus_p2p::quote::QuoteRequest {
            currency: "USDT",
            amount: dec("25"),
            reference: "p2p-deposit-1",
        })
        .await
        .unwrap_err();
    assert_eq!(error.effect(), Effect::NotDone);
}
