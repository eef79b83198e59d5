package shop

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/uniq"
)

// Catalog is what a fresh database starts with: the products on sale and
// the coupons users may claim. shopd loads DefaultCatalog, or the JSON file
// named by -catalog:
//
//	{"products": [{"sku": "SKU-1", "name": "Notebook", "price_cents": 1299, "stock": 100}],
//	 "coupons":  [{"id": 1, "name": "500 off", "discount_cents": 500, "total": 100}]}
//
// Prices are integers in cents. Each user may claim a coupon once.
type Catalog struct {
	Products []Product `json:"products"`
	Coupons  []Coupon  `json:"coupons"`
}

// Product is a product as GET /products shows it.
type Product struct {
	SKU        string `json:"sku"`
	Name       string `json:"name"`
	PriceCents int64  `json:"price_cents"`
	Stock      int64  `json:"stock"`
}

// Coupon is a coupon of the catalogue: DiscountCents off an order, Total
// claims in all, one per user.
type Coupon struct {
	ID            int64  `json:"id"`
	Name          string `json:"name"`
	DiscountCents int64  `json:"discount_cents"`
	Total         int64  `json:"total"`
}

// DefaultCatalog is the catalogue of a fresh database when -catalog is not
// given.
func DefaultCatalog() Catalog {
	return Catalog{
		Products: []Product{
			{SKU: "SKU-1", Name: "Notebook", PriceCents: 1299, Stock: 100},
			{SKU: "BOOK-1", Name: "Book", PriceCents: 2500, Stock: 1000},
		},
		Coupons: []Coupon{
			{ID: 1, Name: "500 off", DiscountCents: 500, Total: 100},
		},
	}
}

// Catalogue limits.
const (
	maxCatalogItems = 10000
	maxNameLen      = 200
	maxCents        = 1_000_000_000_00 // one billion currency units
	maxStock        = 1_000_000_000
)

// ReadCatalog reads and validates a catalogue file.
func ReadCatalog(path string) (Catalog, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Catalog{}, fmt.Errorf("-catalog: %w", err)
	}
	var c Catalog
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Catalog{}, fmt.Errorf("-catalog %s: %w", path, err)
	}
	if dec.More() {
		return Catalog{}, fmt.Errorf("-catalog %s: data after the catalogue object", path)
	}
	if err := c.Validate(); err != nil {
		return Catalog{}, fmt.Errorf("-catalog %s: %w", path, err)
	}
	return c, nil
}

// Validate checks a catalogue: SKUs in the shop's SKU syntax and unique,
// names non-empty, prices, stock and totals within bounds, coupon ids
// positive and unique.
func (c Catalog) Validate() error {
	if len(c.Products) == 0 {
		return errors.New("the catalogue has no products")
	}
	if len(c.Products) > maxCatalogItems || len(c.Coupons) > maxCatalogItems {
		return fmt.Errorf("at most %d products and %d coupons", maxCatalogItems, maxCatalogItems)
	}
	skus := map[string]bool{}
	for i, p := range c.Products {
		switch {
		case len(p.SKU) == 0 || len(p.SKU) > maxSKULen || !skuPattern.MatchString(p.SKU):
			return fmt.Errorf("products[%d]: sku %q must be 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", i, p.SKU, maxSKULen)
		case skus[p.SKU]:
			return fmt.Errorf("products[%d]: sku %q appears twice", i, p.SKU)
		case p.Name == "" || len(p.Name) > maxNameLen:
			return fmt.Errorf("products[%d] (%s): name must be 1 to %d bytes", i, p.SKU, maxNameLen)
		case p.PriceCents < 0 || p.PriceCents > maxCents:
			return fmt.Errorf("products[%d] (%s): price_cents must be from 0 to %d", i, p.SKU, int64(maxCents))
		case p.Stock < 0 || p.Stock > maxStock:
			return fmt.Errorf("products[%d] (%s): stock must be from 0 to %d", i, p.SKU, maxStock)
		}
		skus[p.SKU] = true
	}
	ids := map[int64]bool{}
	for i, cp := range c.Coupons {
		switch {
		case cp.ID <= 0:
			return fmt.Errorf("coupons[%d]: id must be a positive integer", i)
		case ids[cp.ID]:
			return fmt.Errorf("coupons[%d]: id %d appears twice", i, cp.ID)
		case cp.Name == "" || len(cp.Name) > maxNameLen:
			return fmt.Errorf("coupons[%d] (%d): name must be 1 to %d bytes", i, cp.ID, maxNameLen)
		case cp.DiscountCents <= 0 || cp.DiscountCents > maxCents:
			return fmt.Errorf("coupons[%d] (%d): discount_cents must be from 1 to %d", i, cp.ID, int64(maxCents))
		case cp.Total < 0 || cp.Total > maxStock:
			return fmt.Errorf("coupons[%d] (%d): total must be from 0 to %d", i, cp.ID, maxStock)
		}
		ids[cp.ID] = true
	}
	return nil
}

// digest identifies a catalogue: the hex SHA-256 of its JSON.
func (c Catalog) digest() string {
	b, _ := json.Marshal(c) // plain structs of strings and integers
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ErrCatalogMismatch is returned by Seed when the database already holds
// a catalogue other than the one given: a catalogue loads only into a
// fresh database.
var ErrCatalogMismatch = errors.New("shop: the database already holds another catalogue; -catalog loads only into a fresh database")

// catalogMeta is the shop_meta row that records which catalogue seeded
// the database.
const catalogMeta = "catalog_sha256"

// Seed loads c into a fresh (migrated) database, once: the first of any
// number of concurrent callers inserts the shop_meta row that names c's
// digest, and the products and coupons, in one transaction; the others
// find the row. A database seeded with c already is left as it is; one
// seeded with another catalogue is an ErrCatalogMismatch (the catalogue
// only seeds: prices and stock then live in the database).
func Seed(ctx context.Context, db *sql.DB, d sqlstore.Dialect, c Catalog) error {
	if d == nil {
		d = sqlstore.SQLite
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("shop: catalogue: %w", err)
	}
	want := c.digest()
	for attempt := 0; ; attempt++ {
		seeded, err := seedOnce(ctx, db, d, c, want)
		if err == nil {
			if seeded != "" && seeded != want {
				return ErrCatalogMismatch
			}
			return nil
		}
		// Another process seeded between our read and our insert: read
		// again (its row is there now).
		if attempt < 3 && uniq.IsDuplicate(err) {
			continue
		}
		return fmt.Errorf("shop: seed catalogue: %w", err)
	}
}

// seedOnce returns the digest of the catalogue already seeded, or seeds c
// and returns "".
func seedOnce(ctx context.Context, db *sql.DB, d sqlstore.Dialect, c Catalog, digest string) (string, error) {
	var have string
	err := db.QueryRowContext(ctx, rebind(d, `SELECT value FROM shop_meta WHERE name = ?`), catalogMeta).Scan(&have)
	if err == nil {
		return have, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return "", err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback()
	// The meta row first: a concurrent seeder fails here on the primary
	// key, before it has written a product.
	if _, err := tx.ExecContext(ctx, rebind(d, `INSERT INTO shop_meta (name, value) VALUES (?, ?)`), catalogMeta, digest); err != nil {
		return "", err
	}
	for _, p := range c.Products {
		if _, err := tx.ExecContext(ctx, rebind(d, `INSERT INTO shop_products (sku, name, price_cents, stock) VALUES (?, ?, ?, ?)`),
			p.SKU, p.Name, p.PriceCents, p.Stock); err != nil {
			return "", err
		}
	}
	for _, cp := range c.Coupons {
		if _, err := tx.ExecContext(ctx, rebind(d, `INSERT INTO shop_coupons (id, name, discount_cents, total) VALUES (?, ?, ?, ?)`),
			cp.ID, cp.Name, cp.DiscountCents, cp.Total); err != nil {
			return "", err
		}
	}
	return "", tx.Commit()
}
