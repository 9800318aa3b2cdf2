-- The continuous auditor's window over sellers' orders (W1's p2p_seller_liquidity check: the
-- withdraw orders changed since an instant); without it every pass would read every order.
CREATE INDEX index_p2p_withdraw_orders_recent ON p2p_withdraw_orders (updated_at);
