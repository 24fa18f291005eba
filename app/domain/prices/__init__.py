"""The price book of token calls: admin and project prices, and the cost of each call
(``PriceBook.cost_of``, asked by the meter at settle)."""
